// Kernels of the emulation's self-tests (test_emu.cpp), written as CUDA: the same source
// compiles under nvcc. Each line that a test expects a report to name is marked SITE_<name>.
#pragma once

#include "kernels/cuda/device.cuh"

// C[16x16] = A[16x16] B[16x16] (bf16 in, float out) by ldmatrix + two mma.m16n8k16: A
// row-major, B given as Bt[n][k] (plain ldmatrix) or as B[k][n] (ldmatrix.trans). One warp.
__global__ void ra_test_mma(const uint16_t *A, const uint16_t *B, bool b_transposed, float *C)
{
    RA_DYNAMIC_SMEM(uint16_t, sm);
    const ra_smem<uint16_t> sa = sm, sb = sm + 256;
    const int l = threadIdx.x, g = l >> 2, t = l & 3;
    for (int i = l; i < 256; i += 32) sa[i] = A[i], sb[i] = B[i];
    __syncwarp();
    uint32_t a[4], b[4];
    // matrix l >> 3 of A: (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in fragment order a0..a3
    const int am = l >> 3, ar = l & 7;
    ra_ldmatrix_x4(false, a, sa + ((am & 1) * 8 + ar) * 16 + (am >> 1) * 8);
    if (!b_transposed) { // Bt[n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, ...)
        ra_ldmatrix_x4(false, b, sb + ((am >> 1) * 8 + ar) * 16 + (am & 1) * 8);
    } else { // B[k][n]: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), ...
        ra_ldmatrix_x4(true, b, sb + ((am & 1) * 8 + ar) * 16 + (am >> 1) * 8);
    }
    for (int n = 0; n < 2; ++n) {
        const float c[4] = {0, 0, 0, 0};
        float d[4];
        ra_mma_16816(true, d, a, b + 2 * n, c);
        C[g * 16 + n * 8 + 2 * t] = d[0];
        C[g * 16 + n * 8 + 2 * t + 1] = d[1];
        C[(g + 8) * 16 + n * 8 + 2 * t] = d[2];
        C[(g + 8) * 16 + n * 8 + 2 * t + 1] = d[3];
    }
}

// out[b] = sum of block b's blockDim.x inputs: within each warp by xor shuffles, then across
// warps.
__global__ void ra_test_block_sum(const float *in, float *out)
{
    __shared__ float warp_sums[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float v = in[blockIdx.x * blockDim.x + tid];
    for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int warps = (int)(blockDim.x + 31) / 32;
        float w = lane < warps ? warp_sums[lane] : 0.0f;
        for (int m = 16; m >= 1; m >>= 1) w += __shfl_xor_sync(0xffffffffu, w, m);
        if (lane == 0) out[blockIdx.x] = w;
    }
}

// Each thread publishes a value and reads its neighbour's; with_barrier = 0 is the planted bug.
__global__ void ra_test_neighbour(const float *in, float *out, int with_barrier)
{
    RA_DYNAMIC_SMEM(float, sm);
    const int tid = threadIdx.x, n = (int)blockDim.x;
    sm[tid] = in[tid] * 2.0f;
    if (with_barrier) __syncthreads();
    out[tid] = sm[(tid + 1) % n];
}

// Half the block reaches a barrier; the other half returns.
__global__ void ra_test_half_barrier(float *out)
{
    if (threadIdx.x < blockDim.x / 2) {
        __syncthreads(); // SITE_half_barrier
        out[threadIdx.x] = 1.0f;
    }
}

// Two halves of the block at two different barriers.
__global__ void ra_test_split_barrier(float *out)
{
    if (threadIdx.x < blockDim.x / 2) __syncthreads(); // SITE_split_a
    else __syncthreads();                             // SITE_split_b
    out[threadIdx.x] = 1.0f;
}

// A full-mask shuffle that only lanes 0-15 reach.
__global__ void ra_test_partial_shuffle(float *out)
{
    float v = (float)threadIdx.x;
    if ((threadIdx.x & 31) < 16) v = __shfl_xor_sync(0xffffffffu, v, 1); // SITE_partial_shfl
    out[threadIdx.x] = v;
}

// Thread 5 returns before the barrier the others wait at.
__global__ void ra_test_early_return(float *out)
{
    if (threadIdx.x == 5) return;
    __syncthreads(); // SITE_early_barrier
    out[threadIdx.x] = 1.0f;
}

// Stages in[0..4*blockDim) through shared memory with cp.async; wait = 0 is the planted bug.
__global__ void ra_test_cp_async(const float *in, float *out, int wait)
{
    RA_DYNAMIC_SMEM(float, sm);
    const int tid = threadIdx.x;
    ra_cp_async16(sm + 4 * tid, in + 4 * tid, true);
    ra_cp_async_commit();
    if (wait) ra_cp_async_wait<0>();
    __syncthreads();
    for (int i = 0; i < 4; ++i) out[4 * tid + i] = sm[4 * ((tid + 1) % blockDim.x) + i];
    __syncthreads();
    ra_cp_async_wait<0>(); // none in flight at the exit (the emulation reports that)
}

// A thread that exits with its cp.async copies in flight: thread 3 skips the wait.
__global__ void ra_test_cp_async_exit(const float *in)
{
    RA_DYNAMIC_SMEM(float, sm);
    ra_cp_async16(sm + 4 * threadIdx.x, in + 4 * threadIdx.x, true);
    ra_cp_async_commit();
    if (threadIdx.x != 3) ra_cp_async_wait<0>();
}

// ldmatrix from a row address 8 bytes off alignment.
__global__ void ra_test_misaligned_ldmatrix(uint32_t *out)
{
    RA_DYNAMIC_SMEM(uint16_t, sm);
    uint32_t r[4];
    ra_ldmatrix_x4(false, r, sm + 4 + (threadIdx.x & 7) * 8); // SITE_misaligned
    out[threadIdx.x] = r[0];
}

// y[i] += a x[i], one thread per element.
__global__ void ra_test_axpy(const float *x, float *y, float a)
{
    y[threadIdx.x] += a * x[threadIdx.x];
}
