#!/usr/bin/env bash
# GPU check of the paper configuration (issue 13): every stage of experiments/paper.toml on the
# GPU on a few records, CPU vs GPU agreement (span mass to 1e-3, logit_diff to 1e-2 in
# bfloat16), throughput (records/s per stage) and peak GPU memory, in at most 8 minutes.
#
#   benchmarks/gpu_check.sh                      # on a machine with an NVIDIA GPU and this repo
#   benchmarks/gpu_check.sh --device cpu         # the dry run, anywhere (no GPU needed;
#                                                # GPU_CHECK_TIMEOUT=0 lifts the 8 minutes)
#   benchmarks/gpu_check.sh --records 6 --out "$OUT/gpu"   # more records; where files go
#
# Needs only this repo and a Python with torch, transformers, peft, scikit-learn, pandas,
# pyarrow, matplotlib, jaxtyping, tqdm and tokenizers (whatever versions are there: nothing is
# installed or downloaded). The bundled GGUF models cannot travel to a GPU machine, so the
# script builds the Llama-3.1-shaped rehearsal checkpoint there (random weights, the same code
# paths; benchmarks/gpu_check.py). Exit status: 0 agree, 1 disagree, 2 error, 124 over 8 min.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export MPLBACKEND=Agg
# 8 minutes on the GPU; GPU_CHECK_TIMEOUT=0 lifts the limit (a CPU dry run on a busy machine)
exec timeout "${GPU_CHECK_TIMEOUT:-480}" "$PY" benchmarks/gpu_check.py "$@"
