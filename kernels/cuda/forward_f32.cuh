// The forward kernel for float32 storage (DESIGN: CUDA: the backend): SIMT FFMA, since tensor
// cores in bf16 or tf32 cannot meet SPEC 9's float32 limit. One block per (query tile of 64 of a
// query segment, head), 128 threads: two per query row. The pair splits the row's products with a
// key tile of 16 in shared memory by column parity (each a chain of FFMA in column order, the two
// halves added: bitwise repeatable, and the same sum in both threads), then both run SPEC 4's
// scalar update of kernels/softmax_state.h (ra__state_update's steps, unrolled over registers) on
// their half of the D_v columns (by parity too: the pair reads two adjacent words of a V row,
// never one bank twice), so that acc[] fits the register file at D_v = 128 on sm_80 too.
// The segment walk, the logit and the running state across ring steps are those of the tile kernel
// (forward_common.cuh), FULL tiles and top-k thresholds included; head dims below the tile's as
// zero columns.
#pragma once

#include "kernels/cuda/forward_common.cuh"

template <int D, int DV>
__global__ void __launch_bounds__(128, 1) ra_fwd_f32_kernel(ra_attn_args a)
{
    using namespace ra_fwd;
    constexpr int BQ = ra_fwd32::BQ, BK = ra_fwd32::BK, QS = D + 4; // Q rows padded: fewer conflicts
    constexpr int HALF = DV / 2; // the columns of acc this thread owns
    RA_DYNAMIC_SMEM(float, sm);
    const ra_smem<float> sq = sm, sk = sq + BQ * QS, sv = sk + BK * D;
    const int h = (int)blockIdx.y, hk = h / (a.heads / a.kv_heads);
    // this block's D_v columns [v0, v0 + DV) (blockIdx.z: D_v above the tile), this thread's
    // half of them: columns 2 c + half
    const int v0 = (int)blockIdx.z * DV, dv = a.dv - v0 < DV ? a.dv - v0 : DV;
    const int row = (int)threadIdx.x >> 1, half = (int)threadIdx.x & 1;
    auto col = [half](int c) { return 2 * c + half; }; // acc[c]'s column
    const bool owner = half == 0 && blockIdx.z == 0; // writes LSE
    ra_span qtile;
    int64_t qb;
    query_tile(a, (int)blockIdx.x, BQ, &qtile, &qb);
    const int lq = (int)qtile.count;
    const float *gq = static_cast<const float *>(a.q), *gk = static_cast<const float *>(a.k),
                *gv = static_cast<const float *>(a.v);
    // rows [r0, r0 + n) of base (row stride rs) into a tile of row stride ts and `width`
    // columns; zeros past `rows` and in the columns past dim
    auto load = [&](ra_smem<float> tile, int ts, const float *base, int64_t rs, int r0, int rows,
                    int n, int width, int dim) {
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

    // the row's state: each D_v block carries its own copy of (m, l) across steps (state_z)
    const int64_t at = (int64_t)h * a.tq + qb + row, zat = at + (int64_t)blockIdx.z * a.state_z;
    const row_ctx rc = make_row(a, h, qb + row, qtile.pos + row * qtile.stride,
                                a.delta[qtile.seq], row < lq, qshift);
    float m, l, acc[HALF];
    ra__state_init(&m, &l, acc, HALF);
    if (rc.live && !a.first) { // constant indices: acc stays in registers
        m = a.m[zat], l = a.l[zat];
        RA_UNROLL
        for (int c = 0; c < HALF; ++c)
            if (col(c) < dv) acc[c] = a.acc[at * a.dv + v0 + col(c)];
    }
    const float tmin = a.thr_b ? block_min<ra_fwd32::THREADS / 32>(rc.tb) : INFINITY;
    for_each_key_tile(a, (int)blockIdx.x, BK, rc.bias, tmin, [&](const key_tile &kt) {
        const ra_segment kseg = a.ksegs[kt.seg];
        const int k0 = kt.k0, lk = (int)kseg.span.count;
        load(sk, D, gk + kseg.row * a.k_row + hk * a.k_head, a.k_row, k0, lk, BK, D, a.d);
        load(sv, DV, gv + kseg.row * a.v_row + hk * a.v_head + v0, a.v_row, k0, lk, BK, DV, dv);
        ra_cp_async_commit();
        ra_cp_async_wait<0>();
        __syncthreads();
        float s[BK];
        RA_UNROLL
        for (int j = 0; j < BK; ++j) s[j] = 0.0f;
        // this thread's columns in order, Q's two of every four in one 16-byte load (a warp's
        // 16 rows at QS = D + 4 floats apart: 2 wavefronts, its ideal)
        const ra_smem<ra_f32x4> q4 = ra_smem_as<ra_f32x4>(sq + row * QS);
        for (int c = 0; c < D; c += 4) {
            const ra_f32x4 qv = q4[c / 4];
            const float qa = half ? qv.y : qv.x, qb = half ? qv.w : qv.z;
            RA_UNROLL
            for (int j = 0; j < BK; ++j) s[j] = ra_fma(qa, sk[j * D + c + half], s[j]);
            RA_UNROLL
            for (int j = 0; j < BK; ++j) s[j] = ra_fma(qb, sk[j * D + c + 2 + half], s[j]);
        }
        RA_UNROLL
        for (int j = 0; j < BK; ++j) {
            const float z = s[j] + __shfl_xor_sync(0xffffffffu, s[j], 1); // even + odd columns
            const int64_t pj = kseg.span.pos + (int64_t)(k0 + j) * kseg.span.stride;
            s[j] = kt.full ? logit<false>(a, rc, z, true, pj, kseg.row + k0 + j)
                           : logit<true>(a, rc, z, k0 + j < lk, pj, kseg.row + k0 + j);
        }
        // SPEC 4: ra__state_update's steps, unrolled (s and acc stay in registers; through the
        // scalar function's pointers s went to local memory: 25 STL/LDL per tile)
        float mb = -INFINITY, alpha;
        RA_UNROLL
        for (int j = 0; j < BK; ++j) mb = ra__max_nan(s[j], mb);
        if (ra__state_rescale(&m, mb, &alpha)) {
            float sum = 0.0f;
            RA_UNROLL
            for (int c = 0; c < HALF; ++c) acc[c] *= alpha;
            RA_UNROLL
            for (int j = 0; j < BK; ++j) {
                const float p = ra__prob(s[j], m);
                if (p == 0.0f) continue; // masked keys are skipped, never multiplied
                sum += p;
                RA_UNROLL
                for (int c = 0; c < HALF; ++c) acc[c] = ra_fma(p, sv[j * DV + col(c)], acc[c]);
            }
            l = alpha * l + sum;
        }
        __syncthreads(); // the next tiles overwrite sk and sv
    });
    ra_cp_async_wait<0>(); // a tile that met no key tile still has Q's copies in flight
    if (!rc.live) return;
    if (!a.last) {
        if (half == 0) a.m[zat] = m, a.l[zat] = l;
        RA_UNROLL
        for (int c = 0; c < HALF; ++c)
            if (col(c) < dv) a.acc[at * a.dv + v0 + col(c)] = acc[c];
        return;
    }
    // ra__state_finalize (SPEC 4, with SPEC 11's sink) over this thread's columns below dv: an
    // empty row has acc = 0, so O = 0 exactly, and LSE = -inf (the sink without a key)
    float inv;
    const float lse = ra__state_lse_sink(m, l, a.sinks ? a.sinks[h] : -INFINITY, &inv);
    float *o = static_cast<float *>(a.o) + (qb + row) * a.o_row + (int64_t)h * a.o_head;
    RA_UNROLL
    for (int c = 0; c < HALF; ++c)
        if (col(c) < dv) {
            ra_count_global_store(o + v0 + col(c), 4);
            o[v0 + col(c)] = acc[c] * inv;
        }
    if (owner) {
        ra_count_global_store(a.lse + at, 4);
        a.lse[at] = lse;
    }
}

// Shared memory of ra_fwd_f32_kernel<D, DV>.
constexpr size_t ra_fwd_f32_smem(int d, int dv)
{
    return ((size_t)ra_fwd32::BQ * (d + 4) + (size_t)ra_fwd32::BK * (d + dv)) * 4;
}
