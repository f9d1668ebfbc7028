#!/usr/bin/env bash
# Prepares .gpu-deps/ for tests/gpu/run.sh: the GPU machine (a CUDA image with torch, cmake, ninja
# and nvcc, and no network) lacks the libraries torchrr builds with. This downloads their Debian
# packages as .deb files (apt-get download: nothing is installed here) and copies gcc's
# libbacktrace; run.sh unpacks them into a prefix of its own there (dpkg -x), never into /.
# About 13 MB; the device tool carries it with `carry: [".gpu-deps"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-deps
rm -rf "$out"
mkdir -p "$out/debs" "$out/extra/include" "$out/extra/lib"
PKGS=(flatbuffers-compiler libflatbuffers-dev libflatbuffers2 libzstd-dev libzstd1
      libboost1.74-dev libboost-stacktrace1.74-dev libgtest-dev libcli11-dev nlohmann-json3-dev
      libfmt-dev libfmt9 libxxhash-dev libxxhash0 libunwind8)
(cd "$out/debs" && apt-get download "${PKGS[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
n=$(ls "$out"/debs/*.deb | wc -l)
if [ "$n" -ne "${#PKGS[@]}" ]; then
  echo "gpu_bundle: got $n of ${#PKGS[@]} packages" >&2
  exit 1
fi
# The recorder symbolizes native stacks with gcc's libbacktrace (libgcc-N-dev).
gcc_dir=$(dirname "$(gcc -print-file-name=libbacktrace.a)")
cp "$gcc_dir/libbacktrace.a" "$out/extra/lib/"
cp "$gcc_dir/include/backtrace.h" "$gcc_dir/include/backtrace-supported.h" "$out/extra/include/"
du -sh "$out"
