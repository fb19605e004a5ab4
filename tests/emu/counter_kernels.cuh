// Kernels of known memory behaviour for the emulation's counters' self-tests
// (test_emu_counters.cpp), written as CUDA: one warp each unless said otherwise.
#pragma once

#include "kernels/cuda/device.cuh"

// Every lane loads the float at shared index lane * stride (mod the tile): stride 1 is
// conflict-free (1 wavefront), 0 a broadcast (1), 32 a 32-way conflict (32); with spread = 8
// lanes l read (l / 8) + (l % 8) * 32: 4 banks, 8 distinct words each (8 wavefronts).
__global__ void ra_count_shared_loads(float *out, int stride, int spread)
{
    RA_DYNAMIC_SMEM(float, sm);
    const int l = (int)threadIdx.x;
    for (int i = l; i < 1024; i += 32) sm[i] = (float)i;
    __syncwarp();
    const int at = spread ? (l / spread) + (l % spread) * 32 : l * stride % 1024;
    out[l] = sm[at];
}

// Every lane loads the float at global index lane * stride: stride 1 is 4 sectors (128 bytes),
// stride 8 (32 bytes apart) 32 sectors.
__global__ void ra_count_global_loads(const float *in, float *out, int stride)
{
    const int l = (int)threadIdx.x;
    ra_count_global_load(in + l * stride, 4);
    out[l] = in[l * stride];
}

// A loop (the counters log each lane's accesses as runs of one stride): for i in [0, n) lane l
// loads global float l + i (a window sliding by 4 bytes: 4 sectors where it starts on a
// 32-byte boundary, 5 elsewhere) and shared float (l * shared_stride + i * 32) % 1024 (each
// iteration the same banks: shared_stride 1 is conflict-free, 32 a 32-way conflict). With
// split, odd lanes step their shared index by 64 instead of 32 (two strides: each request on
// its own), and the upper half of the warp stops after n / 2 iterations.
__global__ void ra_count_loops(const float *in, float *out, int n, int shared_stride, int split)
{
    RA_DYNAMIC_SMEM(float, sm);
    const int l = (int)threadIdx.x;
    for (int i = l; i < 1024; i += 32) sm[i] = (float)i;
    __syncwarp();
    const int step = split && l % 2 ? 64 : 32, last = split && l >= 16 ? n / 2 : n;
    float sum = 0.0f;
    for (int i = 0; i < last; ++i) {
        ra_count_global_load(in + l + i, 4);
        const float g = in[l + i];
        const float s = sm[(l * shared_stride + i * step) % 1024];
        sum += g * s;
    }
    out[l] = sum;
}

// One mma.m16n8k16 of A = 1 (or 0: a padding tile) and B = 1, then two shuffles, a barrier and
// two cp.async groups in flight.
__global__ void ra_count_mma(int a_zero, float *out)
{
    RA_DYNAMIC_SMEM(float, sm);
    const uint32_t one = 0x3f803f80u; // two bf16 1.0
    const uint32_t a[4] = {a_zero ? 0u : one, a_zero ? 0u : one, a_zero ? 0u : one, a_zero ? 0u : one};
    const uint32_t b[2] = {one, one};
    const float c[4] = {0, 0, 0, 0};
    float d[4];
    ra_mma_16816(true, d, a, b, c);
    d[0] = __shfl_xor_sync(0xffffffffu, d[0], 1);
    d[0] = __shfl_xor_sync(0xffffffffu, d[0], 2);
    __syncthreads();
    ra_cp_async16(sm + 4 * threadIdx.x, out + 4 * threadIdx.x, true);
    ra_cp_async_commit();
    ra_cp_async16(sm + 128 + 4 * threadIdx.x, out + 4 * threadIdx.x, true);
    ra_cp_async_commit();
    ra_cp_async_wait<0>();
    __syncthreads();
    out[threadIdx.x] = d[0] + sm[threadIdx.x];
}

// ldmatrix.x4 of rows 16 bytes apart within each matrix (rows = 16: conflict-free, 4 wavefronts)
// or 128 bytes apart (rows = 128: the 8 rows of a matrix in one bank group, 8-way: 32).
__global__ void ra_count_ldmatrix(int row_bytes, uint32_t *out)
{
    RA_DYNAMIC_SMEM(uint16_t, sm);
    const int l = (int)threadIdx.x;
    for (int i = l; i < 4096; i += 32) sm[i] = (uint16_t)i;
    __syncwarp();
    uint32_t r[4];
    ra_ldmatrix_x4(false, r, sm + ((l >> 3) * 8 * row_bytes + (l & 7) * row_bytes) / 2);
    out[l] = r[0];
}
