#!/usr/bin/env bash
# Reproduces this folder (finished runs are skipped, interrupted ones continue).
# Its 44 runs took 3:53:16 of wall time in all (their results.json; start-up and planning not counted); plans.csv has each run's expected time.
cd "$(dirname "$0")"/../../..
python scripts/compare.py --out results/cpu_2026-11-28/comparison
# Added 2026-11-29 (commit 7d46156; its fast evaluation reads 16 batches, so the added runs were evaluated again on
# the table's 8 with scripts/evaluate.py, whose replaced_eval in each results.json keeps the 16-batch numbers):
python scripts/compare.py --entries peer_gpt 'pkm_gpt+memory_plus=pkm_gpt --config memory_plus_cpu' ultramem_gpt --classes 2m --seeds 2 --out results/cpu_2026-11-28/comparison
python scripts/compare.py --entries peer_gpt 'pkm_gpt+memory_plus=pkm_gpt --config memory_plus_cpu' ultramem_gpt --classes 40s --out results/cpu_2026-11-28/comparison
for run in results/cpu_2026-11-28/comparison/runs/{peer_gpt,pkm_gpt+memory_plus,ultramem_gpt}_*; do python scripts/evaluate.py "$run" --mode fast --eval_max_batches 8; done
python scripts/compare.py --collect results/cpu_2026-11-28/comparison/runs --out results/cpu_2026-11-28/comparison
