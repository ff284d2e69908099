#!/usr/bin/env bash
# The GPU check of the LRAM kernels (issues 14 and 34) in one command of about 8 minutes: kernel tests on CUDA,
# where an LRAM layer's time goes at width 768, then the memory-layer benchmark at the sizes that judge the goals
# (bf16, then fp32 with TF32 off), PKM with the Triton product-key search (the baseline) and with torch.topk
# (the old path). Every step writes to $OUT/<step>.txt as it runs (the benchmark also its CSV, row by row), has
# its own timeout and does not stop the ones after it; $OUT/summary.tsv lists step, exit code, seconds.
# Timeouts sum to 560 s (+ 215 s with BASE).
#
#   OUT=/path/to/results bash projects/lram_gpt/gpu_check_v2.sh     (from any folder; it runs in the repository root)
#   BASE=0255b19 OUT=... bash projects/lram_gpt/gpu_check_v2.sh     first times the kernels of commit BASE (0255b19:
#       the one-kernel forward over all 232 points, before the frame kernel and the 82 candidates; 6846cae: the
#       one-kernel backward, [8, m] tiles, before the rows over 4 lanes and the query kernel; 5b931a2: a lane
#       per slot in the backward) on the same GPU, from a `git archive` of it in $OUT/base: compare
#       $OUT/base_bench_bf16/*.csv with $OUT/*bf16.csv (scripts/report_memory_layers.py prints either) and keep
#       the faster kernels where both pass their tests. Needs a git checkout with that commit.
#   SKIP_TESTS=1 OUT=... bash projects/lram_gpt/gpu_check_v2.sh      leaves out the kernel tests (run elsewhere)
set -u

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=disabled
export OUT="${OUT:-gpu_results}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
printf 'step\texit\tseconds\n' >"$OUT/summary.tsv"
parallel=()
python -c "import xdist" 2>/dev/null && parallel=(-n 8)

step() {  # name, timeout in seconds, command...
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    echo "\$ $*  (timeout ${limit}s, $(date -u +%FT%TZ))" | tee "$OUT/$name.txt"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$OUT/$name.txt"
    rc=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" | tee -a "$OUT/summary.tsv"
}

if [[ -n "${BASE:-}" ]]; then  # the committed kernels first, from a clean export of BASE
    rm -rf "$OUT/base" && mkdir -p "$OUT/base" && git archive "$BASE" | tar -x -C "$OUT/base" || {
        echo "BASE=$BASE: git archive failed (no git checkout, or no such commit)"; exit 2; }
    (cd "$OUT/base" && export PYTHONPATH="$PWD" && mkdir -p "$OUT/base_bench_bf16"
        step base_kernel_tests 120 env -u TRITON_INTERPRET LANGUINI_TEST_DEVICE=cuda python -m pytest \
            tests/lram_gpt/test_lookup.py "${parallel[@]}" -q -p no:cacheprovider
        step base_profile_lram_768_atomic 25 python scripts/profile_memory_layer.py --layer lram --width 768 \
            --memory_size 2^18 --value_grad atomic --rows 12
        step base_bench_bf16 70 python scripts/bench_memory_layers.py --precision bf16 --widths 768 \
            --params 2^20,2^24,2^28 --layers lram --repeats 5 --warmup 2 --out "$OUT/base_bench_bf16")
fi
step environment 15 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
    python -c "import torch, triton, numpy; print(torch.__version__, triton.__version__, numpy.__version__,
    torch.cuda.get_device_name())"; git rev-parse HEAD 2>/dev/null || true'
[[ -n "${SKIP_TESTS:-}" ]] ||  # set when scripts/gpu_session.sh's `tests` step ran them just before
    step kernel_tests 120 env -u TRITON_INTERPRET LANGUINI_TEST_DEVICE=cuda python -m pytest tests/lram_gpt \
        tests/pkm_gpt tests/qlstm "${parallel[@]}" -q -p no:cacheprovider --durations=10
for grad in atomic segment; do
    step "profile_lram_768_$grad" 25 python scripts/profile_memory_layer.py --layer lram --width 768 \
        --memory_size 2^18 --value_grad "$grad" --rows 12
done
step profile_lram_768_forward 20 python scripts/profile_memory_layer.py --layer lram --width 768 \
    --memory_size 2^18 --mode forward --rows 8
step bench_bf16 150 python scripts/bench_memory_layers.py --precision bf16 --widths 512,768 \
    --params 2^20,2^24,2^28 --repeats 5 --warmup 2 --out "$OUT"
step bench_fp32 120 python scripts/bench_memory_layers.py --precision fp32 --widths 768,4096 \
    --params 2^24,2^28 --repeats 5 --warmup 2 --out "$OUT"
# PKM's own time: the search kernels against torch.topk (the old baseline) on the same sizes
step profile_pkm_768 25 python scripts/profile_memory_layer.py --layer pkm --width 768 --rows 12
mkdir -p "$OUT/pkm_torch_search"
step bench_pkm_torch_search 60 python scripts/bench_memory_layers.py --precision bf16 --widths 512,768 \
    --params 2^20,2^24,2^28 --layers pkm --pkm_search torch --repeats 5 --warmup 2 --out "$OUT/pkm_torch_search"
column -t -s $'\t' "$OUT/summary.tsv" 2>/dev/null || cat "$OUT/summary.tsv"
