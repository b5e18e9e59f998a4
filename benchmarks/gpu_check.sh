#!/usr/bin/env bash
# GPU check of the paper configuration: the paper-shaped stand-in's per-stage table by prompt
# length (benchmarks/standin.py on the GPU: peak GPU memory, seconds, bytes written, at 512 to
# 4,096 tokens; at most 2 minutes), then every stage of experiments/paper.toml on the GPU on a
# few records, CPU vs GPU agreement (span mass to 1e-3, logit_diff to 1e-2 in bfloat16),
# two shards on one GPU, a device map, throughput (records/s per stage) and peak GPU memory;
# at most 9.5 minutes in all (OUT/gpu_check.json is written after each step).
#
#   benchmarks/gpu_check.sh                      # on a machine with an NVIDIA GPU and this repo
#   benchmarks/gpu_check.sh --device cpu         # the dry run, anywhere (no GPU needed; the
#                                                # reduced stand-in; GPU_CHECK_TIMEOUT=0 lifts
#                                                # the 9.5 minutes)
#   benchmarks/gpu_check.sh --records 6 --out "$OUT/gpu"   # more records; where files go
#
# Needs only this repo and a Python with torch, transformers, peft, scikit-learn, pandas,
# pyarrow, matplotlib, jaxtyping, tqdm and tokenizers (whatever versions are there: nothing is
# installed or downloaded). The bundled GGUF models cannot travel to a GPU machine, so the
# script builds the Llama-3.1-shaped rehearsal checkpoint there (random weights, the same code
# paths; benchmarks/gpu_check.py). Exit status: 0 agree, 1 disagree, 2 error, 124 over the
# 9.5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export MPLBACKEND=Agg
# 9.5 minutes on the GPU (gpu_check.py reads the same limit to share it between its steps);
# GPU_CHECK_TIMEOUT=0 lifts it (a CPU dry run on a busy machine)
export GPU_CHECK_TIMEOUT="${GPU_CHECK_TIMEOUT:-570}"
if [ "$GPU_CHECK_TIMEOUT" = 0 ]; then exec "$PY" benchmarks/gpu_check.py "$@"; fi
exec timeout "$GPU_CHECK_TIMEOUT" "$PY" benchmarks/gpu_check.py "$@"
