#!/usr/bin/env bash
# The commands of this folder's GPU session, in the order they ran (each call: `bash .../commands.sh callN`;
# call 2 ran the same commands typed into the device tool, its results written to $OUT directly).
# Results go to /tmp/r and are packed into $OUT/results.tgz every 15 s, so a timeout loses nothing.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
pip install --no-index --no-deps --quiet --target /tmp/site .whl/*.whl  # DeepSpeed: not in the image
export PYTHONPATH="$PWD:/tmp/site"
R=/tmp/r && mkdir -p "$R"
(while sleep 15; do tar czf "$OUT/results.tmp" -C "$R" . && mv "$OUT/results.tmp" "$OUT/results.tgz"; done) &
packer=$!
case "$1" in
    call1)
        OUT=$R/session bash scripts/gpu_session.sh env tests             # step 1: every kernel test on CUDA
        SKIP_TESTS=1 OUT=$R/lram timeout 330 bash projects/lram_gpt/gpu_check_v2.sh  # step 2: profiles, benchmark
        OUT=$R/session bash scripts/gpu_session.sh row_sam   # step 3: the row missing from the last session
        ;;
    call2)  # what the 357 s left allowed: width 768 in bf16 again (cut at PKM 2^28), one compiled row
        timeout 150 python scripts/bench_memory_layers.py --precision bf16 --widths 768 --params 2^24,2^28 \
            --repeats 5 --warmup 2 --out "$R"
        OUT=$R/session timeout 100 bash scripts/gpu_session.sh row_switch_gpt_compiled
        ;;
esac
kill $packer
tar czf "$OUT/results.tgz" -C "$R" .
