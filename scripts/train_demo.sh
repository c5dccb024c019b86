#!/usr/bin/env bash
# Trains a small causal transformer on 2 CPU ranks (DDP, gloo) through odb and
# through a fixed-batch "Standard" DataLoader at the same recipe (16 samples per
# optimizer step: Standard accumulates micro-batches, odb runs accumulation
# windows of the same expected loss tokens), and prints the comparison.
#   ./scripts/train_demo.sh            # table
#   ./scripts/train_demo.sh --global-batch 0   # the old comparison: odb's budget sets its optimizer batch
#   ./scripts/train_demo.sh --json     # figures as JSON (benchmarks)
#   extra flags go to examples/train_demo.py (--samples, --max-tokens, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
./scripts/build.sh >&2
export OMP_NUM_THREADS=1
exec /usr/bin/python3 examples/train_demo.py --global-batch 16 "$@"
