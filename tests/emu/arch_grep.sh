#!/usr/bin/env bash
# One program for both CUDA builds: no __CUDA_ARCH__ or __CUDACC__ logic outside the wrapper
# headers -- kernels/cuda/device.cuh (instructions, shared memory, launch) and
# base/host_device.h (the one qualifier of helpers shared with C) -- and the emulation
# (emu/).
# usage: arch_grep.sh SOURCE_DIR
set -euo pipefail
cd "$1"
found="$(grep -rlE '__CUDA_ARCH__|__CUDACC__' include base masks kernels comm plan ring api tools tests/emu \
         --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' --include='*.cpp' \
         --include='*.hpp' | grep -vE '^kernels/cuda/device\.cuh$|^base/host_device\.h$|^emu/' || true)"
if [[ -n "$found" ]]; then
    echo "arch_grep: __CUDA_ARCH__/__CUDACC__ outside the wrapper headers and emu:"
    echo "$found"
    exit 1
fi
echo "arch_grep: only the wrapper headers and emu test __CUDA_ARCH__/__CUDACC__"
