#!/usr/bin/env bash
# FlashAttention-4 (CuTe DSL) as an optional peer on the GPU machine (benchmarks/attention_backward.py --fa4,
# scripts/profile_attention_backward.py --fa4, scripts/profile_fa4.py): downloads its Python 3.12 wheels here and
# packs them for two device calls, since one call carries at most 64 MiB (../shared/FACTS.md). The 92 MB
# nvidia-cutlass-dsl-libs-cu13 wheel is unpacked, tar'ed and xz-compressed (~64 MB) and split: .fa4a/fa4.part.aa
# (40 MB, carried alone by a first call that copies it to /tmp) and .fa4b/ (the rest, the small wheels and
# install.sh, carried by a second call made at once - the machine stays warm about 30 s). Both folders stay out of
# git (add '/.fa4*/' to .git/info/exclude). Nothing here is a dependency of numbatma.
#   bash scripts/fetch_fa4_wheels.sh
#   device call 1 (carry .fa4a):        cp .fa4a/fa4.part.aa /tmp/
#   device call 2 (carry .whl .fa4b):   <the numpy install line>; . .fa4b/install.sh || exit 1; PARTS=backward
#                                       BACKWARD_ARGS="... --fa4" bash scripts/gpu_suite.sh
# install.sh unpacks everything into a fresh folder and exports EXTRA_PYTHONPATH (which gpu_suite.sh puts after its own
# site) and PYTHONPATH. Versions as measured in docs/attention.md and benchmarks/results/attention-backward-2026-11-28-d.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
         --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
         --platform manylinux2014_x86_64 -d "$work" "$@"; }
dl "nvidia-cutlass-dsl==4.8.1" "nvidia-cutlass-dsl-libs-cu13==4.8.1" "nvidia-cutlass-dsl-libs-base==4.8.1" \
   "nvidia-cutlass-dsl-libs-core==4.8.1" "apache-tvm-ffi==0.1.15.post2" "typing_extensions==4.16.0" \
   "flash-attn-4==4.0.0b36" "quack-kernels==0.6.5" "einops==0.8.2" "protobuf==7.36.2"
rm -rf .fa4a .fa4b
mkdir -p .fa4a .fa4b "$work/big"
(cd "$work/big" && python3 -m zipfile -e "$work"/nvidia_cutlass_dsl_libs_cu13-*.whl . )
tar -C "$work/big" -cf - . | xz -9e -T2 > "$work/cu13.tar.xz"
split -b 40000000 "$work/cu13.tar.xz" "$work/fa4.part."
mv "$work/fa4.part.aa" .fa4a/
mv "$work"/fa4.part.a[b-z] .fa4b/
find "$work" -maxdepth 1 -name '*.whl' ! -name 'nvidia_cutlass_dsl_libs_cu13-*' -exec mv {} .fa4b/ \;
cat > .fa4b/install.sh <<'EOF'
# source on the GPU machine after the numpy install line: FA4 + CuTe DSL unpacked into $fa
fa=$(mktemp -d)
cat /tmp/fa4.part.aa .fa4b/fa4.part.a[b-z] > /tmp/cu13.tar.xz && python3 - "$fa" <<'PY' || return 1
import glob, sys, tarfile, zipfile
dst = sys.argv[1]
tarfile.open("/tmp/cu13.tar.xz", "r:xz").extractall(dst)
for w in glob.glob(".fa4b/*.whl"):
    zipfile.ZipFile(w).extractall(dst)  # (pip --target would skip the folder the big wheel made)
print("fa4 unpacked into", dst)
PY
export EXTRA_PYTHONPATH="$fa:$fa/nvidia_cutlass_dsl/dsl_packages"; export PYTHONPATH="$EXTRA_PYTHONPATH:$PYTHONPATH"
python3 -c "import flash_attn.cute, cutlass; print('FA4 imports')" || return 1
EOF
du -sh .fa4a .fa4b
