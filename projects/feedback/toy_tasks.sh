#!/usr/bin/env bash
# The toy-task table of projects/feedback/README.md: each task, both models, 3 seeds, 120 CPU s of training per
# model and seed on one thread, in two processes side by side (one per core; the budget is CPU time, so they do
# not shorten each other's training). About 40 minutes on 2 cores.
#   bash projects/feedback/toy_tasks.sh [OUT]        (default OUT: results/feedback_toy_tasks)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${1:-results/feedback_toy_tasks}
mkdir -p "$OUT"
common=(--seconds 120 --seeds 0 1 2 --d_model 64 --n_layers 2 --n_heads 4 --batch_size 32 --lr 2e-3)
run() {  # name, then the task's flags
    local name=$1
    shift
    python projects/feedback/toy_tasks.py "$@" "${common[@]}" --json "$OUT/$name.json" --plot "$OUT/$name.png" \
        > "$OUT/$name.txt"
    cat "$OUT/$name.txt"
}
(
    run copy --task copy --n 16 --window 8
    run reverse --task reverse --n 16 --window 8
    run counting --task counting --n 50 --window 16
) &
first=$!
run random_walk --task random_walk --n 64 --grid 6 --window 8
run algorithmic --task algorithmic --n 30 --variables 3 --window 32
wait "$first"
