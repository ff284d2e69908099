#!/usr/bin/env bash
# Reproduces this folder (finished runs are skipped, interrupted ones continue).
# Its 44 runs took 3:53:16 of wall time in all (their results.json; start-up and planning not counted); plans.csv has each run's expected time.
cd "$(dirname "$0")"/../../..
python scripts/compare.py --out results/cpu_2026-11-28/comparison
