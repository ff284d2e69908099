#!/usr/bin/env bash
# Everything a session with one GPU should run: environment, kernel tests on CUDA, throughput sweeps,
# benchmarks and short training runs. Each step logs to $OUT/<step>.log (default OUT: gpu_results/), has its
# own timeout and does not stop the ones after it; $OUT/summary.tsv lists step, exit code, seconds, verdict.
# The script exits with 1 when any step failed.
#
#   OUT=/path/to/results bash scripts/gpu_session.sh            # all steps; their timeouts sum to ~37 min
#   bash scripts/gpu_session.sh env tests                       # chosen steps or groups, in the order given
#
# Steps (timeouts in seconds) and groups; each line's timeouts sum to under 10 minutes, a common limit per command:
#   env (45) tests (390; a process per core, at most 16, with pytest-xdist where it is installed; 173 s on 16 cores)
#   switch_gpt (420: its kernel tests on CUDA, a small teacher distilled into a GPT, Switch attention in fp32)
#   throughput = throughput_gpt (90) throughput_qlstm (90) throughput_lram_gpt (210) throughput_pkm_gpt (190)
#   bench      = bench_qlstm (150) bench_memory_bf16 (200) bench_memory_fp32 (200) bench_sam_topk (45)
#                bench_neural_bloom (45)
#   bench_pkm_torch_search (120): PKM with its old search (torch.topk), to set beside bench_memory_bf16's PKM
#   train      = train_gpt (100) train_qlstm (120) train_lram_gpt (100) train_pkm_gpt (100)
#   feedback   = tests_feedback (200) bench_feedback (300)         (the Feedback Transformer: kernel, CUDA graphs,
#   feedback_train = throughput_feedback (420) train_feedback (150)  speed against the GPT; not in the default order)
#   memory_options = train_lram_gpt_options (100) train_pkm_gpt_options (100)  (two blocks sharing one gated memory)
#   several_gpus (420; memory shards and experts split over 2 GPUs against copied ones; skipped with one GPU)
#   rows = row_switch_gpt row_compressive row_shortformer row_shortformer_128 row_feedback row_sam (50-150 each: one
#          batch size, no sweep, an RTX 3090 row derived from GPT small); rows_compiled (90 each, --compile true)
# Throughput rows are appended to copies of the registries in $OUT/throughput/<project>.csv, not to projects/.
# The memory layers, which have no published rows, also get a row derived for the paper's RTX 3090 by ratio to
# GPT small measured in the same step (measure_throughput.py --derive).
# Training runs (200 steps of the small config at batch 16) write to a scratch folder; their logs and results
# (not the checkpoints) are copied to $OUT/runs. They read DATA_ROOT with VOCAB_SIZE when both are set (a
# prepared book corpus), else the embedded default corpus, which the first one builds in data/default_corpus.
# Needs torch, triton, numpy, deepspeed, sentencepiece, tqdm, matplotlib and pytest (the env step lists them).
# The lent machines' image had no DeepSpeed on 2026-11-26: carry it as wheels (deepspeed, hjson, pydantic,
# pydantic-core, annotated-types, typing-inspection) and put their install folder after the repository on PYTHONPATH.
set -u

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export WANDB_MODE=disabled

env_report() {
    nvidia-smi
    echo
    python --version
    git rev-parse HEAD 2>/dev/null && git status --short 2>/dev/null || echo "no git checkout here"
    python - <<'EOF'
import importlib

import torch

print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
if torch.cuda.is_available():
    print(f"device {torch.cuda.get_device_name()}, capability {torch.cuda.get_device_capability()}, "
          f"bf16 {torch.cuda.is_bf16_supported()}, {torch.cuda.mem_get_info()[1] / 2**30:.1f} GiB")
else:
    print("torch sees no CUDA device")
for name in ("triton", "numpy", "deepspeed", "sentencepiece", "tqdm", "matplotlib", "pytest", "wandb"):
    try:
        print(f"{name} {getattr(importlib.import_module(name), '__version__', '?')}")
    except Exception as error:  # a missing package fails the steps that need it; say so here first
        print(f"{name} MISSING: {error}")
EOF
}

kernel_tests() {  # compiling the kernels takes most of the time and runs on the CPU: one process per core (<= 16)
    local parallel=() cores
    cores=$(nproc)
    python -c "import xdist" 2>/dev/null && parallel=(-n $((cores < 16 ? cores : 16)))
    # every test file with a kernel or a CUDA path (those taking the `device` fixture)
    env -u TRITON_INTERPRET LANGUINI_TEST_DEVICE=cuda python -m pytest tests/lram_gpt tests/pkm_gpt tests/qlstm \
        tests/sam/test_topk.py tests/switch_gpt/test_moe.py tests/compressive/test_rel_attention.py \
        tests/feedback/test_window_attention.py tests/feedback/test_model.py \
        "${parallel[@]}" -q -p no:cacheprovider --durations=15 --junitxml="$OUT/tests.xml"
}

throughput_sweep() {  # project [more flags]; the largest batch tried is that of the small compute classes
    local project=$1
    shift
    mkdir -p "$OUT/throughput"
    cp "projects/$project/throughput.csv" "$OUT/throughput/$project.csv" &&
        python scripts/measure_throughput.py "$project" small --sweep --max_batch_size 128 --steps 10 --warmup 3 \
            --registry "$OUT/throughput/$project.csv" "$@"
}

throughput_row() {  # project batch [more flags]: one batch size (no sweep), and the RTX 3090 row derived from it
    local project=$1 batch=$2
    shift 2
    mkdir -p "$OUT/throughput"
    [[ -f "$OUT/throughput/$project.csv" ]] || cp "projects/$project/throughput.csv" "$OUT/throughput/$project.csv"
    python scripts/measure_throughput.py "$project" small --batch_size "$batch" --steps 10 --warmup 2 \
        --registry "$OUT/throughput/$project.csv" --derive 'RTX 3090' --baseline gpt:small "$@"
}

bench_qlstm() {
    python projects/qlstm/bench_cells.py --steps 3 --warmup 1
}

bench_memory_layers() {  # precision; widths and targets that give every fact the LRAM goals are read against
    python scripts/bench_memory_layers.py --precision "$1" --widths 512,4096 --params 2^20,2^22,2^24,2^26,2^28 \
        --repeats 5 --warmup 2 --out "$OUT"
}

bench_pkm_torch_search() {  # PKM with its old search (torch.topk), beside the Triton search of bench_memory_bf16
    mkdir -p "$OUT/pkm_torch_search" &&
        python scripts/bench_memory_layers.py --precision bf16 --widths 512,4096 --params 2^20,2^24,2^28 --layers pkm \
            --pkm_search torch --repeats 5 --warmup 2 --out "$OUT/pkm_torch_search"
}

train_smoke() {  # project [more flags]; the checkpoint (model and Adam state) stays in $SCRATCH, the rest is copied
    local project=$1 data=()
    shift
    [[ -n "${DATA_ROOT:-}" && -n "${VOCAB_SIZE:-}" ]] && data=(--data_root "$DATA_ROOT" --vocab_size "$VOCAB_SIZE")
    python "projects/$project/train.py" --config small "${data[@]}" --max_steps 200 --batch_size 16 \
        --eval_max_batches 4 --slow_eval_max_windows 8 --eval_every 50 --checkpoint_every 200 --log_every 20 \
        --out_dir "$SCRATCH/runs" "$@"
    local status=$?
    mkdir -p "$OUT/runs"
    (cd "$SCRATCH/runs" 2>/dev/null && find . -type f ! -name '*.pt' -exec cp --parents {} "$OUT/runs/" \;)
    ls -la "$SCRATCH/runs"/* 2>/dev/null
    rm -rf "$SCRATCH/runs"
    return $status
}

feedback_tests() {  # the window-attention kernel, the model through it and its CUDA-graph replay, on the GPU
    env -u TRITON_INTERPRET LANGUINI_TEST_DEVICE=cuda python -m pytest tests/feedback -q -p no:cacheprovider \
        --durations=10 --junitxml="$OUT/tests_feedback.xml"
}

bench_feedback() {  # training and generation speed against the GPT of the same size; CUDA graphs on and off
    python projects/feedback/bench_speed.py --config small --batch_size 64 --steps 3 --warmup 2 --gen_batch 1 \
        --csv "$OUT/bench_feedback_small_b64.csv" &&
        python projects/feedback/bench_speed.py --config small --batch_size 64 --steps 3 --warmup 2 \
            --cuda_graphs false --skip_inference --csv "$OUT/bench_feedback_small_b64_eager.csv" &&
        python projects/feedback/bench_speed.py --config mini --batch_size 256 --steps 3 --warmup 2 --gen_batch 8 \
            --csv "$OUT/bench_feedback_mini_b256.csv"
}

switch_gpt_check() {  # its kernel tests on CUDA; a small switch_gpt (bf16, the grouped kernel) distilled into a gpt
    env -u TRITON_INTERPRET LANGUINI_TEST_DEVICE=cuda python -m pytest tests/switch_gpt -q -p no:cacheprovider \
        --durations=10 || return 1
    local data=() common
    [[ -n "${DATA_ROOT:-}" && -n "${VOCAB_SIZE:-}" ]] && data=(--data_root "$DATA_ROOT" --vocab_size "$VOCAB_SIZE")
    common=(--config small "${data[@]}" --max_steps 100 --batch_size 16 --eval_max_batches 4 --slow_eval_max_windows 8
            --eval_every 50 --log_every 20 --out_dir "$SCRATCH/switch")
    python projects/switch_gpt/train.py "${common[@]}" --run_name teacher &&
        python scripts/distill.py --teacher "$SCRATCH/switch/teacher" --project gpt "${common[@]}" --run_name student &&
        python projects/switch_gpt/train.py "${common[@]}" --expert_attention true --precision fp32 --run_name attention
    local status=$?
    mkdir -p "$OUT/runs"
    (cd "$SCRATCH/switch" 2>/dev/null && find . -type f ! -name '*.pt' -exec cp --parents {} "$OUT/runs/" \;)
    rm -rf "$SCRATCH/switch"
    return $status
}

several_gpus() {  # memory tables and experts split over 2 GPUs (NCCL) against copied ones, then the benchmark
    local gpus
    gpus=$(nvidia-smi -L | wc -l)
    if [[ $gpus -lt 2 ]]; then
        echo "skipped: $gpus GPU here; splitting parameters over GPUs needs 2 or more"
        return 0
    fi
    local common=(--config small --max_steps 20 --batch_size 16 --log_every 1 --eval_max_batches 2
                  --slow_eval_max_windows 2 --out_dir "$SCRATCH/several")
    # the memories against one GPU; the experts against DDP on 2 GPUs (capacity counts each process's tokens)
    for run in "lram_gpt --memory_shards 2" "pkm_gpt --memory_shards 2" "switch_gpt --expert_parallel 2"; do
        read -r project split <<<"$run"
        torchrun --standalone --nproc_per_node 2 "projects/$project/train.py" "${common[@]}" $split \
            --run_name "${project}_split" || return 1
        if [[ $project == switch_gpt ]]; then
            torchrun --standalone --nproc_per_node 2 "projects/$project/train.py" "${common[@]}" \
                --run_name "${project}_copied" || return 1
        else
            python "projects/$project/train.py" "${common[@]}" --run_name "${project}_copied" || return 1
        fi
        python - "$SCRATCH/several/${project}_split" "$SCRATCH/several/${project}_copied" <<'EOF'
import json, sys
losses = [{r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/log.jsonl")) if r["event"] == "train"}
          for d in sys.argv[1:]]
print(f"{sys.argv[1]}: largest loss difference to the copied layout over 20 steps (bf16): "
      f"{max(abs(losses[0][s] - losses[1][s]) for s in losses[1]):.3g}")
EOF
    done
    rm -rf "$SCRATCH/several"
    python scripts/bench_sharded_memory.py --width 1024 --tokens 8192 --lram_memory 2^22 --pkm_keys 512 --out "$OUT"
}

bench_neural_bloom() {  # Table 5.2 of Rae's thesis on the GPU: the Neural Bloom Filter's and LSTM's latency, throughput
    python projects/neural_bloom/bench.py --task timing --device cuda --out "$OUT/neural_bloom_timing.json"
}

export -f env_report kernel_tests throughput_sweep throughput_row bench_qlstm bench_memory_layers \
    bench_pkm_torch_search train_smoke feedback_tests bench_feedback switch_gpt_check several_gpus bench_neural_bloom

ORDER="env tests switch_gpt throughput_gpt throughput_qlstm throughput_lram_gpt throughput_pkm_gpt bench_qlstm
       bench_memory_bf16 bench_memory_fp32 bench_pkm_torch_search bench_sam_topk bench_neural_bloom
       train_gpt train_qlstm train_lram_gpt train_pkm_gpt train_lram_gpt_options train_pkm_gpt_options several_gpus"
# step: timeout in seconds, command
declare -A STEPS=(
    [env]="45 env_report"
    [tests]="390 kernel_tests"
    [switch_gpt]="420 switch_gpt_check"
    [throughput_gpt]="90 throughput_sweep gpt"
    [throughput_qlstm]="90 throughput_sweep qlstm"
    [throughput_lram_gpt]="210 throughput_sweep lram_gpt --derive 'RTX 3090' --baseline gpt:small"
    [throughput_pkm_gpt]="190 throughput_sweep pkm_gpt --derive 'RTX 3090' --baseline gpt:small"
    [bench_qlstm]="150 bench_qlstm"
    [bench_memory_bf16]="200 bench_memory_layers bf16"
    [bench_memory_fp32]="200 bench_memory_layers fp32"
    [bench_pkm_torch_search]="120 bench_pkm_torch_search"
    [bench_sam_topk]="45 python projects/sam/bench_topk.py"
    [bench_neural_bloom]="45 bench_neural_bloom"
    [train_gpt]="100 train_smoke gpt"
    [train_qlstm]="120 train_smoke qlstm"
    [train_lram_gpt]="100 train_smoke lram_gpt"
    [train_pkm_gpt]="100 train_smoke pkm_gpt"
    [tests_feedback]="200 feedback_tests"
    [throughput_feedback]="420 throughput_sweep feedback --derive 'RTX 3090' --baseline gpt:small"
    [bench_feedback]="300 bench_feedback"
    [train_feedback]="150 train_smoke feedback --max_steps 30 --eval_every 15 --checkpoint_every 30 --log_every 5"
    [train_lram_gpt_options]="100 train_smoke lram_gpt --memory_layers 3,7 --share_memory true --memory_gate silu"
    [train_pkm_gpt_options]="100 train_smoke pkm_gpt --memory_layers 3,7 --share_memory true --memory_gate silu"
    [several_gpus]="420 several_gpus"
    [row_switch_gpt]="50 throughput_row switch_gpt 64"
    [row_compressive]="50 throughput_row compressive 64"
    [row_shortformer]="50 throughput_row shortformer 64"
    [row_shortformer_128]="50 throughput_row shortformer 256 --seq_len 128"
    [row_feedback]="70 throughput_row feedback 64"
    [row_sam]="150 throughput_row sam 64 --warmup 1"
    [row_switch_gpt_compiled]="90 throughput_row switch_gpt 64 --compile true"
    [row_compressive_compiled]="90 throughput_row compressive 64 --compile true"
    [row_shortformer_compiled]="90 throughput_row shortformer 64 --compile true"
)
declare -A STEP_GROUPS=(
    [throughput]="throughput_gpt throughput_qlstm throughput_lram_gpt throughput_pkm_gpt"
    [bench]="bench_qlstm bench_memory_bf16 bench_memory_fp32 bench_sam_topk bench_neural_bloom"
    [train]="train_gpt train_qlstm train_lram_gpt train_pkm_gpt"
    [feedback]="tests_feedback bench_feedback"
    [feedback_train]="throughput_feedback train_feedback"
    [memory_options]="train_lram_gpt_options train_pkm_gpt_options"
    [rows]="row_switch_gpt row_compressive row_shortformer row_shortformer_128 row_feedback row_sam"
    [rows_compiled]="row_switch_gpt_compiled row_compressive_compiled row_shortformer_compiled"
)
selected=()
for name in ${@:-$ORDER}; do
    if [[ -v "STEP_GROUPS[$name]" ]]; then
        selected+=(${STEP_GROUPS[$name]})
    elif [[ -v "STEPS[$name]" ]]; then
        selected+=("$name")
    else
        echo "unknown step or group '$name'; steps:" $ORDER "${STEP_GROUPS[feedback]} ${STEP_GROUPS[feedback_train]};" \
            "groups: throughput bench train memory_options feedback feedback_train rows rows_compiled" >&2
        exit 2
    fi
done

total=0
for name in "${selected[@]}"; do
    read -r limit _ <<<"${STEPS[$name]}"
    total=$((total + limit))
done
export OUT="${OUT:-gpu_results}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SUMMARY="$OUT/summary.tsv"
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/gpu_session.XXXXXX")"
export SCRATCH
echo "steps: ${selected[*]}; timeouts sum to ${total}s; results in $OUT"

run_step() {
    local name=$1 limit command start rc verdict
    read -r limit command <<<"${STEPS[$name]}"
    start=$SECONDS
    echo "\$ $command  (timeout ${limit}s, $(date -u +%FT%TZ))" >"$OUT/$name.log"
    timeout --kill-after=15 "$limit" bash -c "$command" >>"$OUT/$name.log" 2>&1
    rc=$?
    case $rc in
        0) verdict=ok ;;
        124) verdict="timed out after ${limit}s" ;;
        137) verdict="killed: timed out and ignored SIGTERM, or out of memory" ;;
        *) verdict=failed ;;
    esac
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" "$verdict" >>"$SUMMARY"
    echo "$name: $verdict (exit $rc, $((SECONDS - start))s)"
    if [[ $rc -ne 0 ]]; then
        tail -n 15 "$OUT/$name.log" | sed 's/^/    /'
        failures=$((failures + 1))
    fi
}

[[ -f "$SUMMARY" ]] || printf 'step\texit\tseconds\tverdict\n' >"$SUMMARY"
failures=0
for name in "${selected[@]}"; do
    run_step "$name"
done
rmdir "$SCRATCH" 2>/dev/null
echo
column -t -s $'\t' "$SUMMARY" 2>/dev/null || cat "$SUMMARY"
exit $((failures > 0))
