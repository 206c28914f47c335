#!/usr/bin/env bash
# The one prepared GPU check, for a machine with an NVIDIA GPU and no package registry:
#
#   bash gpu/fetch_gpu_wheels.sh              # here: fills .whl/ (orjson, plotly and what plotly needs)
#   OUT=/tmp/gpu-out bash gpu/gpu_check.sh    # there, from the repository root, with .whl/ carried along
#
# Installs the carried wheels into a scratch folder (pip --target; unzipping them if pip is missing),
# then runs gpu/check.py (python -m gpu.check) with the machine's own python3 and torch: every part in its own
# process and time limit, the whole within BUDGET_S seconds (default 420). $OUT receives
# gpu_check.json (every figure and check), one log per part and artifacts.tar.gz (traces, NCCL logs,
# tables, the HTML report). Exit 0 when every check passed, 1 when one failed, 2 without CUDA.
# PARTS=models,capture runs only those parts.
# REHEARSE=1 runs the same parts on CPU (Gloo, simulated NVML) to test the check itself; its figures
# are not GPU measurements and the JSON says so.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-$(mktemp -d /tmp/gpu-out.XXXXXX)}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/tpbench-gpu-check.XXXXXX)
SITE="$WORK/site"
if compgen -G ".whl/*.whl" > /dev/null; then
  if ! "$PY" -m pip --version > /dev/null 2>&1; then
    echo "gpu_check: $PY has no pip; unzipping the wheels of .whl/ instead" >&2
    for w in .whl/*.whl; do "$PY" -m zipfile -e "$w" "$SITE"; done
  elif ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl; then
    echo "gpu_check: the wheels of .whl/ do not install for $PY (made for CPython 3.12); using its own packages" >&2
  fi
else
  echo "gpu_check: no .whl/ folder (bash gpu/fetch_gpu_wheels.sh makes it); using the machine's packages only" >&2
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PY" -m gpu.check --out "$OUT" --work "$WORK" --budget-s "${BUDGET_S:-420}" ${REHEARSE:+--rehearse} ${PARTS:+--parts "$PARTS"}
