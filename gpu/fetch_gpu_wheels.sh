#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with the wheels the GPU machine lacks, for gpu/gpu_check.sh to install
# there without a package registry. That machine runs CPython 3.12 on x86_64 Linux and already has torch,
# numpy, pandas, pyarrow, rich, psutil, nvidia-ml-py and pytest; it lacks orjson and plotly (plotly needs
# narwhals and packaging). One pinned version of each, dependencies listed explicitly (--no-deps).
#
#   bash gpu/fetch_gpu_wheels.sh          # then carry .whl with the tree
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(orjson==3.13.0 plotly==7.1.0 narwhals==2.29.0 packaging==26.4)
rm -rf .whl && mkdir .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
ls -l .whl
du -sh .whl
