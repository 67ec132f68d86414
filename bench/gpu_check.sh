#!/usr/bin/env bash
# GPU readiness check (issue #19): pre-training in bf16 and fp16 for --minutes (default 2), an fp16
# resume of a CPU checkpoint, bit-for-bit resume with deterministic kernels, compile: true, a
# 2-process torchrun (sharing one GPU if only one exists), fine-tuning; prints tokens/s, MFU and
# PASS/FAIL per check and writes gpu_check.json ($OUT/ when set). Details: bench/gpu_check.py.
#
#   bench/gpu_check.sh                                           # all checks (~12 min on one GPU)
#   bench/gpu_check.sh --only bf16,fp16,resume,exact            # or in two calls of < 10 min each
#   bench/gpu_check.sh --only compile,ddp,finetune
#   bench/gpu_check.sh --cpu                                     # smoke mode on the CPU (~20 s; tested)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export TQDM_DISABLE=1 BERTRACE_NO_MLFLOW=1
exec "$PY" bench/gpu_check.py "$@"
