// The forward kernel's core (CUDA.md section 1, FlashAttention 2's structure), bf16/f16 storage:
// one block per (query tile of 64 rows, head); 4 warps of 16 rows; Q, K, V tiles in dynamic
// shared memory in 16-byte chunks swizzled by `chunk ^ (row % 8)`, loaded by cp.async with zero
// fill past the end; S = Q K^T by mma.m16n8k16 from ldmatrix fragments; the SPEC 4 guarded
// update of kernels/softmax_state.h in registers, row max and sum over the quad by
// __shfl_xor_sync 1 and 2; P's accumulators packed to 16 bits are the A fragments of P V; V as
// B through ldmatrix.trans. One ring step per launch: the running state (m, l, acc) of SPEC 4 is
// float32 in device memory between steps; the last step writes O and LSE.
//
// So far: packed variable-length batches of contiguous sequences (one grid z per sequence), the
// SPEC 3 window with bottom-right alignment, GQA, scale, softcap and ALiBi (SPEC 2), D != D_v;
// key tiles outside the block's window hull (EMPTY) are skipped. The strided spans of the
// segment model, dynamic masks and FULL tiles without a per-element mask come next.
#pragma once

#include "kernels/cuda/device.cuh"
#include "kernels/softmax_state.h"

struct ra_fwd_tile_args {
    const uint16_t *q, *k, *v; // [T_q, H, D], [T_k, H_kv, D], [T_k, H_kv, D_v] (element strides)
    int64_t q_row, q_head, k_row, k_head, v_row, v_head;
    uint16_t *o;               // [T_q, H, D_v], written at the last step
    int64_t o_row, o_head;
    float *lse;                // [H, T_q], written at the last step
    float *m, *l, *acc;        // the running state: [H, T_q], [H, T_q], [H, T_q, D_v]
    const int32_t *cu_q, *cu_k; // [num_seqs + 1] device memory: this step's rows of each sequence
    const int64_t *delta;      // [num_seqs] SPEC 2: query i of sequence b sees its diagonal at
                               // key i + delta[b] of this step's keys of b
    int tq, heads, kv_heads;   // tq: every query row (the state's and LSE's row count)
    int window_left, window_right; // SPEC 3, -1 = unbounded
    float scale, softcap, inv_softcap; // softcap 0: off
    const float *alibi;        // [H] device memory, or NULL
    int first, last, bf16;
};

namespace ra_fwd {

constexpr int BQ = 64, BK = 64, WARPS = 4;

// The swizzled address of 16-bit element (row, col) of a tile of D columns.
template <int D> __device__ __forceinline__ int swz(int row, int col)
{
    constexpr int chunks = D / 8, period = chunks < 8 ? chunks : 8;
    const int chunk = col / 8;
    return row * D + ((chunk ^ (row % period)) * 8) + col % 8;
}

// Rows [r0, r0 + n) of a sequence (base: its first row of a [T, heads, D] tensor, at the head)
// into a swizzled tile; zeros at and past `rows`, the sequence's length.
template <int D>
__device__ __forceinline__ void load_tile(uint16_t *tile, const uint16_t *base, int64_t row_stride,
                                          int r0, int rows, int n)
{
    constexpr int chunks = D / 8;
    for (int c = (int)threadIdx.x; c < n * chunks; c += (int)blockDim.x) {
        const int r = c / chunks, ch = c % chunks, src_row = r0 + r;
        const bool in = src_row < rows;
        const uint16_t *src = base + (int64_t)(in ? src_row : 0) * row_stride + ch * 8;
        ra_cp_async16(tile + swz<D>(r, ch * 8), src, in);
    }
}

// SPEC 2 and 3 for query qi and key kj of one sequence (positions within it): the logit of the
// raw product z, or -inf where the mask forbids the pair.
__device__ __forceinline__ float logit(const ra_fwd_tile_args &a, float z, int qi, int lq, int kj,
                                       int lk, int64_t delta, float slope)
{
    const int64_t diag = qi + delta;
    if (qi >= lq || kj >= lk) return -INFINITY;
    if (a.window_left >= 0 && kj < diag - a.window_left) return -INFINITY;
    if (a.window_right >= 0 && kj > diag + a.window_right) return -INFINITY;
    z *= a.scale;
    if (a.softcap > 0.0f) z = a.softcap * tanhf(z * a.inv_softcap);
    if (a.alibi) z -= slope * (float)(diag > kj ? diag - kj : kj - diag);
    return z;
}

// The keys [*lo, *hi) that any of the query rows [q0, q1) may see (SPEC 3's window as a hull):
// key tiles outside are EMPTY for the whole block and skipped (exactly: an update by a fully
// masked tile rescales by exp(0) = 1 and adds 0).
__device__ __forceinline__ void key_hull(const ra_fwd_tile_args &a, int q0, int q1, int lk,
                                         int64_t delta, int *lo, int *hi)
{
    int64_t from = 0, to = lk;
    if (a.window_left >= 0) from = q0 + delta - a.window_left;
    if (a.window_right >= 0) to = (int64_t)(q1 - 1) + delta + a.window_right + 1;
    from = from < 0 ? 0 : from;
    to = to > lk ? lk : to;
    *lo = (int)(from / BK * BK);
    *hi = (int)(to > from ? to : from);
}

} // namespace ra_fwd

// Grid: (query tiles of the longest sequence, heads, sequences); 128 threads.
template <int D, int DV>
__global__ void __launch_bounds__(128) ra_fwd_tile_kernel(ra_fwd_tile_args a)
{
    using namespace ra_fwd;
    RA_DYNAMIC_SMEM(uint16_t, sm);
    uint16_t *sq = sm, *sk = sm + BQ * D, *sv = sk + BK * D;
    const int h = (int)blockIdx.y, hk = h / (a.heads / a.kv_heads), q0 = (int)blockIdx.x * BQ;
    const int b = (int)blockIdx.z, qb = a.cu_q[b], lq = a.cu_q[b + 1] - qb;
    const int kb = a.cu_k[b], lk = a.cu_k[b + 1] - kb;
    if (q0 >= lq) return; // the whole block: this sequence has fewer query tiles
    const int64_t delta = a.delta[b];
    const float slope = a.alibi ? a.alibi[h] : 0.0f;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const bool bf16 = a.bf16 != 0;

    load_tile<D>(sq, a.q + qb * a.q_row + h * a.q_head, a.q_row, q0, lq, BQ);
    ra_cp_async_commit();

    // this lane's two rows (g, g + 8 of its warp's 16, within the sequence) and their state
    const int rows[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    float m[2], l[2], acc[DV / 8][4];
    RA_UNROLL
    for (int r = 0; r < 2; ++r) {
        const int64_t at = (int64_t)h * a.tq + qb + rows[r];
        const bool live = rows[r] < lq && !a.first;
        m[r] = live ? a.m[at] : -INFINITY;
        l[r] = live ? a.l[at] : 0.0f;
        RA_UNROLL
        for (int n = 0; n < DV / 8; ++n)
            RA_UNROLL
            for (int c = 0; c < 2; ++c)
                acc[n][2 * r + c] = live ? a.acc[at * DV + n * 8 + 2 * t + c] : 0.0f;
    }

    uint32_t qf[D / 16][4]; // Q's A fragments, loaded once
    int k_lo, k_hi;
    key_hull(a, q0, q0 + BQ < lq ? q0 + BQ : lq, lk, delta, &k_lo, &k_hi);
    for (int k0 = k_lo; k0 < k_hi; k0 += BK) {
        load_tile<D>(sk, a.k + kb * a.k_row + hk * a.k_head, a.k_row, k0, lk, BK);
        load_tile<DV>(sv, a.v + kb * a.v_row + hk * a.v_head, a.v_row, k0, lk, BK);
        ra_cp_async_commit();
        ra_cp_async_wait<0>();
        __syncthreads();
        if (k0 == k_lo) {
            const int am = lane >> 3, ar = lane & 7;
            RA_UNROLL
            for (int kk = 0; kk < D / 16; ++kk)
                ra_ldmatrix_x4(false, qf[kk],
                               sq + swz<D>(warp * 16 + (am & 1) * 8 + ar, kk * 16 + (am >> 1) * 8));
        }
        // S = Q K^T, 16 x 64 per warp: 8 n-tiles of 8 keys
        float s[BK / 8][4];
        RA_UNROLL
        for (int n = 0; n < BK / 8; ++n)
            RA_UNROLL
            for (int c = 0; c < 4; ++c) s[n][c] = 0.0f;
        RA_UNROLL
        for (int kk = 0; kk < D / 16; ++kk)
            RA_UNROLL
            for (int np = 0; np < BK / 16; ++np) {
                uint32_t b[4];
                const int bm = lane >> 3, br = lane & 7;
                ra_ldmatrix_x4(false, b, sk + swz<D>(np * 16 + (bm >> 1) * 8 + br, kk * 16 + (bm & 1) * 8));
                ra_mma_16816(bf16, s[2 * np], qf[kk], b, s[2 * np]);
                ra_mma_16816(bf16, s[2 * np + 1], qf[kk], b + 2, s[2 * np + 1]);
            }
        // SPEC 3 mask and SPEC 4 guarded update, row by row
        RA_UNROLL
        for (int r = 0; r < 2; ++r) {
            float mb = -INFINITY;
            RA_UNROLL
            for (int n = 0; n < BK / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 2; ++c) {
                    float &x = s[n][2 * r + c];
                    x = logit(a, x, rows[r], lq, k0 + n * 8 + 2 * t + c, lk, delta, slope);
                    mb = x > mb ? x : mb;
                }
            mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, 1));
            mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, 2));
            float alpha = 1.0f;
            const int any = ra__state_rescale(&m[r], mb, &alpha);
            float sum = 0.0f;
            RA_UNROLL
            for (int n = 0; n < BK / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 2; ++c) {
                    float &x = s[n][2 * r + c];
                    x = any ? ra__prob(x, m[r]) : 0.0f;
                    sum += x;
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (!any) continue;
            l[r] = alpha * l[r] + sum;
            RA_UNROLL
            for (int n = 0; n < DV / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 2; ++c) acc[n][2 * r + c] *= alpha;
        }
        // acc += P V: P's accumulators are the A fragments, V through ldmatrix.trans
        RA_UNROLL
        for (int j = 0; j < BK / 16; ++j) {
            const uint32_t pa[4] = {ra_pack_16x2(bf16, s[2 * j][0], s[2 * j][1]),
                                    ra_pack_16x2(bf16, s[2 * j][2], s[2 * j][3]),
                                    ra_pack_16x2(bf16, s[2 * j + 1][0], s[2 * j + 1][1]),
                                    ra_pack_16x2(bf16, s[2 * j + 1][2], s[2 * j + 1][3])};
            RA_UNROLL
            for (int dp = 0; dp < DV / 16; ++dp) {
                uint32_t vb[4];
                const int bm = lane >> 3, br = lane & 7;
                ra_ldmatrix_x4(true, vb, sv + swz<DV>(j * 16 + (bm & 1) * 8 + br, dp * 16 + (bm >> 1) * 8));
                ra_mma_16816(bf16, acc[2 * dp], pa, vb, acc[2 * dp]);
                ra_mma_16816(bf16, acc[2 * dp + 1], pa, vb + 2, acc[2 * dp + 1]);
            }
        }
        __syncthreads(); // the next tiles overwrite sk and sv
    }

    RA_UNROLL
    for (int r = 0; r < 2; ++r) {
        if (rows[r] >= lq) continue;
        const int64_t at = (int64_t)h * a.tq + qb + rows[r];
        if (!a.last) {
            if (t == 0) a.m[at] = m[r], a.l[at] = l[r];
            RA_UNROLL
            for (int n = 0; n < DV / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 2; ++c) a.acc[at * DV + n * 8 + 2 * t + c] = acc[n][2 * r + c];
            continue;
        }
        // SPEC 4 finalise: an empty row gives O = 0 and LSE = -inf
        const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
        uint16_t *o = a.o + (int64_t)(qb + rows[r]) * a.o_row + (int64_t)h * a.o_head;
        RA_UNROLL
        for (int n = 0; n < DV / 8; ++n) {
            const uint32_t pair = ra_pack_16x2(bf16, acc[n][2 * r] * inv, acc[n][2 * r + 1] * inv);
            o[n * 8 + 2 * t] = (uint16_t)(pair & 0xffff);
            o[n * 8 + 2 * t + 1] = (uint16_t)(pair >> 16);
        }
        if (t == 0) a.lse[at] = l[r] == 0.0f ? -INFINITY : m[r] + logf(l[r]);
    }
}

// Shared memory of ra_fwd_tile_kernel<D, DV>: Q, K and V tiles.
constexpr size_t ra_fwd_tile_smem(int d, int dv)
{
    return ((size_t)(ra_fwd::BQ + ra_fwd::BK) * d + (size_t)ra_fwd::BK * dv) * 2;
}
