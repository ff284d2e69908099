#!/usr/bin/env bash
# Everything a session with one GPU should run, in steps ordered by value. A lent GPU gives 15 minutes, of which
# the start takes 1-2: the group `call1` (the default) ends within 9 minutes, `call2` runs what fits in the rest.
# Each step logs to $OUT/<step>.log (default OUT: gpu_results/), has its own timeout and does not stop the ones
# after it; $OUT/summary.tsv lists step, exit code, seconds, verdict. With --pack NAME the logs go to a scratch
# folder packed into $OUT/NAME.tgz every 10 s and after each step: a lent machine returns a few files, and a call
# killed at its limit loses only the step in flight. The script exits with 1 when any step failed.
#
#   bash scripts/gpu_session.sh --plan [steps]      each step's expected seconds and timeout; the calls' sums
#   bash scripts/gpu_session.sh --dry_run [steps]   on a CPU: every step's commands built, their scripts found and
#                                                   their flags parsed by the scripts themselves, nothing run
#   OUT=/path/to/results bash scripts/gpu_session.sh            # call1
#   bash scripts/gpu_session.sh env tests                       # chosen steps or groups, in the order given
#
# On a lent machine (the device tool; carry .whl and .base, see below), one call each, back to back:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site;
#   PYTHONUNBUFFERED=1 bash scripts/gpu_session.sh --pack call1 call1      (then the same with call2)
# Leave OUT alone there: the tool returns only what lies under its own $OUT (2026-11-28: a command that set OUT
# itself brought nothing back from call1).
#
# The calls (issue 48): call1 = env, the kernel tests on CUDA, LRAM's kernels against their one-kernel versions
# (LRAM_BASE_TREE, default .base/0255b19: `git archive 0255b19 | tar -x -C .base/0255b19`, carried), the
# memory-layer benchmark at widths 768 and 4096; call2 = the throughput sweep of feedback against GPT small (in
# the same process), the compiled rows of compressive and shortformer; call3 = the comparison grid (compare.py)
# on the book subset (DATA_ROOT=data/gpu_subset VOCAB_SIZE=16384, carried; scripts/README.md says how to make
# it), whose run folders continue where a call cut them only on the same machine. `--plan all` lists every step.
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
CALLER_PYTHONPATH="${PYTHONPATH:-}"  # carried packages (DeepSpeed): kept behind each tree that runs
export PYTHONPATH="$PWD${CALLER_PYTHONPATH:+:$CALLER_PYTHONPATH}"
export REPO="$PWD" CALLER_PYTHONPATH
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
        tests/sam/test_topk.py tests/sam/test_device.py tests/switch_gpt/test_moe.py tests/compressive/test_rel_attention.py \
        tests/feedback/test_window_attention.py tests/feedback/test_model.py tests/peer_gpt tests/ultramem_gpt \
        tests/core/test_product_keys.py tests/core/test_peer_experts.py "${parallel[@]}" -q -p no:cacheprovider --durations=15 --junitxml="$OUT/tests.xml"
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

bench_memory_layers() {  # precision widths params: LRAM, PKM (its Triton search) and the dense MLP
    python scripts/bench_memory_layers.py --precision "$1" --widths "$2" --params "$3" --repeats 5 --warmup 2 \
        --out "$OUT"
}

lram_kernels() {  # device time per kernel of an LRAM training step (width 768, 2^18 rows): this tree, the base's
    local base=${LRAM_BASE_TREE:-.base/0255b19} grad
    if [[ ! -f "$base/scripts/profile_memory_layer.py" ]]; then
        echo "no base tree at $base (LRAM_BASE_TREE): git archive 0255b19 | tar -x -C .base/0255b19, and carry .base"
        return 2
    fi
    base=$(cd "$base" && pwd)
    for grad in atomic segment; do
        echo "== this tree ($(git rev-parse --short HEAD 2>/dev/null || echo 'no git here')), value gradient $grad"
        python scripts/profile_memory_layer.py --layer lram --width 768 --memory_size 2^18 --value_grad "$grad" \
            --rows 14 || return 1
        echo "== base tree $base, value gradient $grad"
        (cd "$base" && PYTHONPATH="$base${CALLER_PYTHONPATH:+:$CALLER_PYTHONPATH}" python \
            scripts/profile_memory_layer.py --layer lram --width 768 --memory_size 2^18 --value_grad "$grad" \
            --rows 14) || return 1
    done
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

sam_tests() {  # SAM on the GPU: the top-K kernel, a training step without host syncs (torch's sync debug mode) and
    # the CUDA-graph replay of its time loop against the eager loop
    env -u TRITON_INTERPRET LANGUINI_TEST_DEVICE=cuda python -m pytest tests/sam/test_device.py tests/sam/test_topk.py \
        -q -p no:cacheprovider --durations=10 --junitxml="$OUT/tests_sam.xml"
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

compare_grid() {  # scripts/compare.py on the GPU: the 9 language models at 20 s and 60 s of the RTX 3090, one seed
    if [[ -z "${DATA_ROOT:-}" ]]; then  # the small configs never train on the embedded corpus
        echo "compare needs DATA_ROOT (and VOCAB_SIZE): a prepared book corpus that travels, e.g. data/gpu_subset"
        return 2
    fi
    local project
    for project in lram_gpt pkm_gpt; do  # no RTX 3090 row yet: derived from GPT small, into this copy's registry
        grep -q 'RTX 3090' "projects/$project/throughput.csv" ||
            python scripts/measure_throughput.py "$project" small --batch_size 64 --steps 10 --warmup 2 \
                --registry "projects/$project/throughput.csv" --derive 'RTX 3090' --baseline gpt:small || return 1
    done
    python scripts/compare.py --entries gpt qlstm lram_gpt pkm_gpt switch_gpt compressive shortformer feedback sam \
        --classes 20s 60s --seeds 1 --out "$OUT/comparison" -- --data_root "$DATA_ROOT" --vocab_size "${VOCAB_SIZE:-16384}"
    local status=$?
    [[ -d "$OUT/comparison" ]] && find "$OUT/comparison" -name "*.pt" -delete  # the checkpoints stay here
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

train_neural_bloom() {  # Table 5.1's database task trained on the GPU for $1 minutes; the run folder comes back
    # the words of pgbooks' train split, which the lent machine lacks (carried; never committed):
    # python projects/neural_bloom/bench.py --save_words data/nbf_words
    [[ -f data/nbf_words/words.txt.gz ]] || { echo "no data/nbf_words/words.txt.gz: make it and carry it" >&2; return 1; }
    python projects/neural_bloom/bench.py --task database --books data/nbf_words --minutes "$1" --lstm false \
        --memnet false --timing false --device cuda --run_dir "$OUT/neural_bloom_database" \
        --out "$OUT/neural_bloom_database.json"
}

export -f train_neural_bloom compare_grid env_report kernel_tests throughput_sweep throughput_row bench_qlstm bench_memory_layers lram_kernels \
    bench_pkm_torch_search train_smoke feedback_tests bench_feedback switch_gpt_check several_gpus bench_neural_bloom

# step: timeout in seconds, expected seconds (from the last sessions' logs on an H200; ~: a guess, not yet
# timed), command. A timeout is the expected time and a margin; call1's timeouts sum to at most CALL_LIMIT.
declare -A STEPS=(
    [env]="20 9 env_report"
    [tests]="320 ~240 kernel_tests"
    [lram_kernels]="80 54 lram_kernels"
    [bench_memory_bf16]="120 80 bench_memory_layers bf16 768,4096 2^24,2^28"
    [bench_memory_fp32]="200 ~150 bench_memory_layers fp32 768,4096 2^24,2^28"
    [switch_gpt]="420 ~300 switch_gpt_check"
    [throughput_gpt]="90 ~60 throughput_sweep gpt"
    [throughput_qlstm]="90 ~60 throughput_sweep qlstm"
    [throughput_lram_gpt]="210 ~150 throughput_sweep lram_gpt --derive 'RTX 3090' --baseline gpt:small"
    [throughput_pkm_gpt]="190 ~140 throughput_sweep pkm_gpt --derive 'RTX 3090' --baseline gpt:small"
    [throughput_feedback]="200 ~150 throughput_sweep feedback --min_batch_size 64 --warmup 1 --derive 'RTX 3090' --baseline gpt:small"
    [throughput_sam]="140 105 throughput_sweep sam --min_batch_size 32 --warmup 1 --derive 'RTX 3090' --baseline gpt:small"
    [tests_sam]="120 ~60 sam_tests"
    [throughput_sam_graph]="160 ~110 throughput_sweep sam --min_batch_size 32 --warmup 2 --cuda_graph true"
    [bench_qlstm]="150 ~100 bench_qlstm"
    [bench_pkm_torch_search]="120 60 bench_pkm_torch_search"
    [bench_sam_topk]="45 ~20 python projects/sam/bench_topk.py"
    [bench_neural_bloom]="45 ~20 bench_neural_bloom"
    [train_neural_bloom]="330 ~280 train_neural_bloom 4"
    [train_gpt]="100 ~70 train_smoke gpt"
    [train_qlstm]="120 ~90 train_smoke qlstm"
    [train_lram_gpt]="100 ~70 train_smoke lram_gpt"
    [train_pkm_gpt]="100 ~70 train_smoke pkm_gpt"
    [tests_feedback]="200 ~120 feedback_tests"
    [bench_feedback]="300 ~200 bench_feedback"
    [train_feedback]="150 ~100 train_smoke feedback --max_steps 30 --eval_every 15 --checkpoint_every 30 --log_every 5"
    [train_lram_gpt_options]="100 ~70 train_smoke lram_gpt --memory_layers 3,7 --share_memory true --memory_gate silu"
    [train_pkm_gpt_options]="100 ~70 train_smoke pkm_gpt --memory_layers 3,7 --share_memory true --memory_gate silu"
    [several_gpus]="420 ~300 several_gpus"
    [compare]="540 ~600 compare_grid"
    [row_switch_gpt]="50 25 throughput_row switch_gpt 64"
    [row_compressive]="50 25 throughput_row compressive 64"
    [row_shortformer]="50 25 throughput_row shortformer 64"
    [row_shortformer_128]="50 25 throughput_row shortformer 256 --seq_len 128"
    [row_feedback]="70 40 throughput_row feedback 64"
    [row_sam]="150 90 throughput_row sam 64 --warmup 1"
    [row_switch_gpt_compiled]="90 ~60 throughput_row switch_gpt 64 --compile true"
    [row_compressive_compiled]="170 ~150 throughput_row compressive 64 --compile true"
    [row_shortformer_compiled]="170 ~150 throughput_row shortformer 64 --compile true"
)
declare -A STEP_GROUPS=(
    [call1]="env tests lram_kernels bench_memory_bf16"
    [call2]="throughput_feedback row_compressive_compiled row_shortformer_compiled"
    [call3]="compare"
    [throughput]="throughput_gpt throughput_qlstm throughput_lram_gpt throughput_pkm_gpt"
    [bench]="bench_qlstm bench_memory_bf16 bench_memory_fp32 bench_sam_topk bench_neural_bloom"
    [train]="train_gpt train_qlstm train_lram_gpt train_pkm_gpt"
    [feedback]="tests_feedback bench_feedback"
    [feedback_train]="throughput_feedback train_feedback"
    [sam]="tests_sam throughput_sam throughput_sam_graph"
    [memory_options]="train_lram_gpt_options train_pkm_gpt_options"
    [rows]="row_switch_gpt row_compressive row_shortformer row_shortformer_128 row_feedback row_sam"
    [rows_compiled]="row_switch_gpt_compiled row_compressive_compiled row_shortformer_compiled"
    [all]="env tests lram_kernels bench_memory_bf16 throughput_feedback throughput_sam row_compressive_compiled
           row_shortformer_compiled bench_memory_fp32 bench_pkm_torch_search switch_gpt throughput_gpt throughput_qlstm
           throughput_lram_gpt throughput_pkm_gpt bench_qlstm bench_sam_topk bench_neural_bloom train_neural_bloom
           train_gpt train_qlstm
           train_lram_gpt train_pkm_gpt tests_feedback bench_feedback train_feedback train_lram_gpt_options
           train_pkm_gpt_options several_gpus compare row_switch_gpt row_compressive row_shortformer row_shortformer_128
           row_feedback row_sam row_switch_gpt_compiled tests_sam throughput_sam_graph"
)
CALL_LIMIT=540  # seconds: a call of the device tool that ends within 9 minutes

mode=run
pack_name=
while [[ "${1:-}" == --* ]]; do
    case "$1" in
        --plan) mode=plan; shift ;;
        --dry_run) mode=dry; shift ;;
        --pack) pack_name=${2:?--pack takes a name, e.g. call1}; shift 2 ;;
        --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option $1 (--plan, --dry_run, --pack NAME, --help)" >&2; exit 2 ;;
    esac
done
selected=()
for name in ${@:-call1}; do
    if [[ -v "STEP_GROUPS[$name]" ]]; then
        selected+=(${STEP_GROUPS[$name]})
    elif [[ -v "STEPS[$name]" ]]; then
        selected+=("$name")
    else
        echo "unknown step or group '$name'; steps: ${!STEPS[*]}; groups: ${!STEP_GROUPS[*]}" >&2
        exit 2
    fi
done

timeouts() {  # the sum of the named steps' timeouts
    local sum=0 name limit
    for name in "$@"; do
        read -r limit _ <<<"${STEPS[$name]}"
        sum=$((sum + limit))
    done
    echo $sum
}
total=$(timeouts "${selected[@]}")

if [[ $mode == plan ]]; then
    printf '%-26s %9s %8s %11s\n' step expected timeout cumulative
    cumulative=0
    for name in "${selected[@]}"; do
        read -r limit expected _ <<<"${STEPS[$name]}"
        cumulative=$((cumulative + limit))
        printf '%-26s %8ss %7ss %10ss%s\n' "$name" "$expected" "$limit" "$cumulative" \
            "$( ((cumulative > CALL_LIMIT)) && echo '  (past one call)')"
    done
    echo "timeouts sum to ${total}s; a call holds ${CALL_LIMIT}s; expected times marked ~ are guesses, not yet timed"
    status=0
    for group in call1 call2 call3; do
        sum=$(timeouts ${STEP_GROUPS[$group]})
        echo "$group: timeouts sum to ${sum}s"
        ((sum <= CALL_LIMIT)) || { echo "$group holds more than one call (${CALL_LIMIT}s)"; status=1; }
    done
    exit $status
fi

export OUT="${OUT:-gpu_results}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/gpu_session.XXXXXX")"
export SCRATCH
if [[ -n $pack_name ]]; then  # the logs in a folder of their own, packed into $OUT/NAME.tgz
    PACK_TO="$OUT/$pack_name.tgz"
    OUT="$SCRATCH/$pack_name"
    mkdir -p "$OUT"
fi
SUMMARY="$OUT/summary.tsv"

if [[ $mode == dry ]]; then
    # stand-ins first on PATH: a Python script's flags are parsed by the script itself and nothing runs
    # (scripts/check_flags.py), pytest collects on the CPU, nvidia-smi and torchrun say what they would do
    dry_bin="$SCRATCH/dry_bin"
    mkdir -p "$dry_bin"
    {
        echo '#!/usr/bin/env bash'
        echo "real=$(command -v python)"
        cat <<'STANDIN'
if [[ "${1:-}" == -m && "${2:-}" == pytest ]]; then
    shift 2
    args=()
    while [[ $# -gt 0 ]]; do  # no workers and no report when only collecting
        case "$1" in -n) shift 2 ;; --junitxml=*) shift ;; *) args+=("$1"); shift ;; esac
    done
    LANGUINI_TEST_DEVICE=cpu exec "$real" -m pytest --collect-only -q "${args[@]}"
elif [[ "${1:-}" == *.py ]]; then
    exec "$real" "$REPO/scripts/check_flags.py" "$@"
fi
exec "$real" "$@"
STANDIN
    } >"$dry_bin/python"
    cat >"$dry_bin/nvidia-smi" <<'STANDIN'
#!/usr/bin/env bash
echo "(dry run) nvidia-smi $*"
[[ "$*" == -L ]] && echo "GPU 0: (dry run)" && echo "GPU 1: (dry run)"
exit 0
STANDIN
    cat >"$dry_bin/torchrun" <<'STANDIN'
#!/usr/bin/env bash
while [[ "${1:-}" == --* ]]; do  # torchrun's own flags, then the script and its flags
    case "$1" in --standalone | --*=*) shift ;; *) shift 2 ;; esac
done
exec python "$@"
STANDIN
    chmod +x "$dry_bin"/*
    export PATH="$dry_bin:$PATH"
    echo "dry run: each step's commands built and checked; nothing runs"
fi

if [[ -n "${PACK_TO:-}" ]]; then  # a lent machine returns a few files: the logs packed as one, again and again
    pack() { tar czf "$PACK_TO.tmp" -C "$OUT" . 2>/dev/null && mv "$PACK_TO.tmp" "$PACK_TO"; }
    (while sleep 10; do pack; done) &
    packer=$!
    trap 'kill $packer 2>/dev/null; pack' EXIT
fi
echo "steps: ${selected[*]}; timeouts sum to ${total}s; results in $OUT"

run_step() {
    local name=$1 limit command start rc verdict
    read -r limit _ command <<<"${STEPS[$name]}"
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
    if [[ -n "${PACK_TO:-}" ]]; then pack; fi
done
rm -rf "$SCRATCH/dry_bin"; [[ -n $pack_name ]] || rmdir "$SCRATCH" 2>/dev/null
echo
column -t -s $'\t' "$SUMMARY" 2>/dev/null || cat "$SUMMARY"
exit $((failures > 0))
