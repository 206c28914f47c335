#!/usr/bin/env bash
# The one prepared GPU check (run on a machine with an NVIDIA GPU, from the repository root):
#
#   OUT=/tmp/gpu-out bash scripts/gpu_check.sh
#
# Exercises every GPU path tpbench has: ZeRO hooks on NCCL (world size 1) and on 2 Gloo ranks
# sharing the GPU, with parity checks and step-time ratios against PyTorch's own hooks
# (CUDA events); capture sweeps with CUDA kernels and memcpys in the traces, NVML sampling at the
# configured rate and the sampler's overhead ratio. Uses the machine's own python3 and torch
# (no install step: the device machine has no network); tpbench is imported from this tree.
set -u
export PYTHONPATH="$PWD:$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
status=0
{ nvidia-smi; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"; } > "$OUT/machine.txt" 2>&1
timeout 240 "$PY" scripts/gpu_zero_hooks.py > "$OUT/zero_hooks.log" 2>&1 || status=1
timeout 300 "$PY" scripts/gpu_capture.py > "$OUT/capture.log" 2>&1 || status=1
# Run directories stay on the machine; the JSON summaries and logs come back.
find "$OUT" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
tail -n 30 "$OUT"/*.log
echo "gpu_check: exit $status"
exit $status
