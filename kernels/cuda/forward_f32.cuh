// The forward kernel for float32 storage (CUDA.md section 1): SIMT FFMA, since tensor cores in
// bf16 or tf32 cannot meet SPEC 9's float32 limit. One block per (query tile of 64 of a query
// segment, head), 64 threads: each owns one query row, computes its logits against a key tile
// of 32 in shared memory in a fixed order (bitwise repeatable), and runs SPEC 4's scalar update
// of kernels/softmax_state.h (ra__state_update) unchanged. The segment walk, the logit and the
// running state across ring steps are those of the tile kernel (forward_common.cuh), FULL tiles
// and top-k thresholds included; head dims below the tile's as zero columns.
#pragma once

#include "kernels/cuda/forward_common.cuh"

namespace ra_fwd32 {
constexpr int BQ = 64, BK = 32;
}

template <int D, int DV>
__global__ void __launch_bounds__(64) ra_fwd_f32_kernel(ra_fwd_tile_args a)
{
    using namespace ra_fwd;
    constexpr int BQ = ra_fwd32::BQ, BK = ra_fwd32::BK, QS = D + 4; // Q rows padded: fewer conflicts
    RA_DYNAMIC_SMEM(float, sm);
    float *sq = sm, *sk = sq + BQ * QS, *sv = sk + BK * D;
    const int h = (int)blockIdx.y, hk = h / (a.heads / a.kv_heads), row = (int)threadIdx.x;
    ra_span qtile;
    int64_t qb;
    query_tile(a, (int)blockIdx.x, BQ, &qtile, &qb);
    const int lq = (int)qtile.count;
    const float *gq = static_cast<const float *>(a.q), *gk = static_cast<const float *>(a.k),
                *gv = static_cast<const float *>(a.v);
    // rows [r0, r0 + n) of base (row stride rs) into a tile of row stride ts and `width`
    // columns; zeros past `rows` and in the columns past dim
    auto load = [&](float *tile, int ts, const float *base, int64_t rs, int r0, int rows, int n,
                    int width, int dim) {
        for (int c = (int)threadIdx.x; c < n * (width / 4); c += (int)blockDim.x) {
            const int r = c / (width / 4), ch = c % (width / 4);
            const bool in = r0 + r < rows && ch * 4 < dim;
            ra_cp_async16(tile + r * ts + ch * 4, base + (in ? (int64_t)(r0 + r) * rs + ch * 4 : 0), in);
        }
    };
    load(sq, QS, gq + qb * a.q_row + h * a.q_head, a.q_row, 0, lq, BQ, D, a.d);
    ra_cp_async_commit();
    const int qshift = q_shift(a);
    if (qshift) { // SPEC 9 (uniform): Q times 2^-qshift, exact
        ra_cp_async_wait<0>();
        __syncthreads();
        for (int i = (int)threadIdx.x; i < BQ * QS; i += (int)blockDim.x) sq[i] = ldexpf(sq[i], -qshift);
    }

    const int64_t at = (int64_t)h * a.tq + qb + row;
    const row_ctx rc = make_row(a, h, qb + row, qtile.pos + row * qtile.stride,
                                a.delta[qtile.seq], row < lq, qshift);
    float m, l, acc[DV];
    ra__state_init(&m, &l, acc, DV);
    if (rc.live && !a.first) {
        m = a.m[at], l = a.l[at];
        for (int c = 0; c < a.dv; ++c) acc[c] = a.acc[at * a.dv + c];
    }
    const float tmin = a.thr_b ? block_min<BQ / 32>(rc.tb) : INFINITY;
    for_each_key_tile(a, qtile, rc.delta, BK, rc.bias, tmin, [&](const key_tile &kt) {
        const ra_segment &kseg = kt.seg;
        const int k0 = kt.k0, lk = (int)kseg.span.count;
        load(sk, D, gk + kseg.row * a.k_row + hk * a.k_head, a.k_row, k0, lk, BK, D, a.d);
        load(sv, DV, gv + kseg.row * a.v_row + hk * a.v_head, a.v_row, k0, lk, BK, DV, a.dv);
        ra_cp_async_commit();
        ra_cp_async_wait<0>();
        __syncthreads();
        float s[BK];
        for (int j = 0; j < BK; ++j) {
            float z = 0.0f;
            for (int c = 0; c < D; ++c) z = fmaf(sq[row * QS + c], sk[j * D + c], z);
            const int64_t pj = kseg.span.pos + (int64_t)(k0 + j) * kseg.span.stride;
            s[j] = kt.full ? logit<false>(a, rc, z, true, pj, kseg.row + k0 + j)
                           : logit<true>(a, rc, z, k0 + j < lk, pj, kseg.row + k0 + j);
        }
        ra__state_update(&m, &l, acc, DV, s, BK, sv, DV); // SPEC 4, the scalar reference
        __syncthreads(); // the next tiles overwrite sk and sv
    });
    if (!rc.live) return;
    if (!a.last) {
        a.m[at] = m, a.l[at] = l;
        for (int c = 0; c < a.dv; ++c) a.acc[at * a.dv + c] = acc[c];
        return;
    }
    float *o = static_cast<float *>(a.o) + (qb + row) * a.o_row + (int64_t)h * a.o_head;
    ra__state_finalize(m, l, acc, a.dv, o, &a.lse[at]); // the columns past dv are zeros
}

// Shared memory of ra_fwd_f32_kernel<D, DV>.
constexpr size_t ra_fwd_f32_smem(int d, int dv)
{
    return ((size_t)ra_fwd32::BQ * (d + 4) + (size_t)ra_fwd32::BK * (d + dv)) * 4;
}
