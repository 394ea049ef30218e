#!/usr/bin/env bash
# Configures and builds into ./build (or $BUILD_DIR). Extra args go to cmake's configure step,
# e.g. scripts/build.sh -DMOEBATCH_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
GEN=()
if command -v ninja >/dev/null 2>&1 && [ ! -f "$BUILD_DIR/Makefile" ]; then GEN=(-G Ninja); fi
# nvcc lives outside PATH on a default CUDA install.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" "$@"
cmake --build "$BUILD_DIR" -j "$(nproc)"
