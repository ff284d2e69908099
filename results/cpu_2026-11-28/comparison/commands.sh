#!/usr/bin/env bash
# Reproduces this folder (finished runs are skipped, interrupted ones continue).
# Its 56 runs took 4:48:30 of wall time in all (their results.json; start-up and planning not counted); plans.csv has each run's expected time.
cd "$(dirname "$0")"/../../..
python scripts/compare.py --out results/cpu_2026-11-28/comparison
# Added 2026-11-29 (commit 7d46156; its fast evaluation reads 16 batches, so the added runs were evaluated again on
# the table's 8 with scripts/evaluate.py, whose replaced_eval in each results.json keeps the 16-batch numbers):
python scripts/compare.py --entries peer_gpt 'pkm_gpt+memory_plus=pkm_gpt --config memory_plus_cpu' ultramem_gpt --classes 2m --seeds 2 --out results/cpu_2026-11-28/comparison
python scripts/compare.py --entries peer_gpt 'pkm_gpt+memory_plus=pkm_gpt --config memory_plus_cpu' ultramem_gpt --classes 40s --out results/cpu_2026-11-28/comparison
# Added 2026-11-29 (commit b275644, the same 16-batch evaluation, evaluated again on 8 as above):
python scripts/compare.py --entries peer_gpt 'pkm_gpt+memory_plus=pkm_gpt --config memory_plus_cpu' ultramem_gpt --classes 6m --out results/cpu_2026-11-28/comparison
for run in results/cpu_2026-11-28/comparison/runs/{peer_gpt,pkm_gpt+memory_plus,ultramem_gpt}_*; do python scripts/evaluate.py "$run" --mode fast --eval_max_batches 8; done
# Evaluated again 2026-11-29 (commit adb0648) on each class's sample as the plan sizes it today, the same text for
# every entry of a class (compare.py now refuses a class that is not): 40 s 8 batches a split, 2 min 16, 6 min 50.
# Before, the 6 min runs had been scored on 8 to 15 batches sized to each model's own speed, and the 2 min runs on 8.
# The 2 min runs of peer_gpt, pkm_gpt+memory_plus and ultramem_gpt kept no checkpoint: their own final evaluation,
# on 16 batches, was put back from replaced_eval. A grid trained afresh today scores these samples by itself.
for run in results/cpu_2026-11-28/comparison/runs/*_6m_seed*; do python scripts/evaluate.py "$run" --mode fast --eval_max_batches 50; done
for run in results/cpu_2026-11-28/comparison/runs/*_2m_seed*; do [ -f "$run/checkpoint.pt" ] && python scripts/evaluate.py "$run" --mode fast --eval_max_batches 16; done
python scripts/compare.py --collect results/cpu_2026-11-28/comparison/runs --out results/cpu_2026-11-28/comparison
