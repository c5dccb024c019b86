#!/usr/bin/env bash
# bench/gpu_run.sh: the GPU benchmark, for a machine with an NVIDIA GPU and
# Debian's python3-torch built with CUDA (not the case for Debian 12's own
# package: use a torch with CUDA in /usr/bin/python3's path, or set PY).
# Builds what it needs (scripts/build.sh), then runs the Standard vs odb demo
# on the GPU: 2 ranks (gloo; both on GPU 0 when there is one GPU), a larger
# model and longer samples than the CPU demo, batches from pinned memory with
# non_blocking copies, timings synchronised. Writes
# bench/results/gpu_demo.json and .log. About 5-10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-/usr/bin/python3}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "bench/gpu_run.sh: $PY's torch sees no CUDA device (torch.cuda.is_available() is False)" >&2
  exit 2
fi
./scripts/build.sh
mkdir -p bench/results
"$PY" -c "import torch; print('GPU:', torch.cuda.get_device_name(0), 'x', torch.cuda.device_count())" \
  | tee bench/results/gpu_demo.log
"$PY" examples/train_demo.py --device cuda --world-size 2 --samples "${SAMPLES:-6000}" --max-len 1024 \
  --max-tokens 8192 --d-model 512 --layers 6 --vocab 4096 --workers 2 --json --quiet \
  2>> bench/results/gpu_demo.log | tee bench/results/gpu_demo.json
