#!/usr/bin/env bash
# Downloads, on a machine with PyPI access, the wheels the GPU suite installs on the GPU machine (which may have
# no internet): numpy < 2.5 (numba-cuda 0.30 cannot import numpy 2.5), pytest-timeout (a hung kernel ends its
# test) and compute-sanitizer (the nvidia-cuda-sanitizer-api wheel, for PARTS=sanitize). Into .whl/ (git-ignored
# locally: add it to .git/info/exclude); carry .whl/ to the GPU machine with the checkout.
#   bash scripts/fetch_wheels.sh [python version, default 3.12]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
mkdir -p .whl
pip_dl() { python3 -m pip download -q --no-deps -d .whl --python-version "$py" --only-binary=:all: "$@"; }
pip_dl --platform manylinux_2_28_x86_64 "numpy==2.4.6"
pip_dl "pytest-timeout==2.4.0"
pip_dl --platform manylinux_2_25_x86_64 "nvidia-cuda-sanitizer-api==13.4.92"
ls -1 .whl
