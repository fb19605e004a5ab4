#!/usr/bin/env bash
# The emulated kernels' source compiles under nvcc too (one program for both builds): the
# self-test kernels (tests/emu/emu_test_kernels.cuh), one float32 forward kernel and one tile
# kernel (kernels/cuda/forward_tile.cuh) for sm_80 and sm_90, with no register spills, and the PTX
# has the wrapper's tensor-core and async-copy instructions. Every other instantiation is the
# CUDA build's (tests/run_tests.sh builds it wherever nvcc is, with a spill a build error), so
# it is not compiled twice here. Skipped (77) without nvcc.
# usage: nvcc_compile.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src="$1" work="$2"
if ! command -v nvcc >/dev/null; then echo "nvcc_compile: no nvcc on PATH: skipped"; exit 77; fi
mkdir -p "$work"
cat > "$work/emu_test_kernels.cu" <<'CU'
#include "tests/emu/emu_test_kernels.cuh"
#include "kernels/cuda/forward_tile.cuh"
#include "kernels/cuda/forward_f32.cuh"
template __global__ void ra_fwd_f32_kernel<64, 64>(ra_attn_args);
template __global__ void ra_fwd_tile_kernel<true, 64, 64, false, 2>(ra_attn_args);
CU
for arch in sm_80 sm_90; do
    # one compilation per arch: -keep leaves its PTX (in keep_$arch/) for the grep below
    mkdir -p "$work/keep_$arch"
    nvcc -std=c++17 -arch="$arch" -I"$src" -I"$src/include" -Xptxas -v -c "$work/emu_test_kernels.cu" \
         -o "$work/emu_test_kernels_$arch.o" -keep -keep-dir "$work/keep_$arch" 2> "$work/ptxas_$arch.txt"
    if grep -q "bytes spill stores" "$work/ptxas_$arch.txt" && \
       grep "spill stores" "$work/ptxas_$arch.txt" | grep -vq " 0 bytes spill stores"; then
        echo "nvcc_compile: $arch: register spills:"; grep spill "$work/ptxas_$arch.txt"; exit 1
    fi
    cp "$(ls "$work/keep_$arch"/*.ptx | head -n 1)" "$work/k_$arch.ptx"
    for insn in mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 \
                ldmatrix.sync.aligned.m8n8.x4.shared.b16 ldmatrix.sync.aligned.m8n8.x4.trans \
                cp.async.cg.shared.global cp.async.wait_group; do
        grep -q "$insn" "$work/k_$arch.ptx" || { echo "nvcc_compile: $arch: no $insn in PTX"; exit 1; }
    done
    grep -E "Compiling entry|registers" "$work/ptxas_$arch.txt" | paste - - | \
        sed -E "s/.*function '([^']*)'.*Used ([0-9]+) registers.*/  \1: \2 registers/"
    echo "nvcc_compile: $arch: compiled, no spills, PTX has mma/ldmatrix/cp.async"
done
