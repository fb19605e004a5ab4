// The SIMT backward's tile products (backward.cuh), register-tiled and free of shared-memory
// bank conflicts (issue 32): a thread holds a small block of pairs or of outputs in registers
// and reads its operands as 16-byte loads of rows padded by 4 floats, so that the 8 lanes of a
// quarter warp reading 8 rows at one column hit 8 distinct groups of 4 banks (a row stride of
// D floats, D a multiple of 32, put every row on one bank: 32-way conflicts, and 2 loads per FMA
// before). Each output's sum keeps a fixed order, so results stay bitwise repeatable (SPEC 9),
// and a logit's dot product keeps the float32 forward kernel's order (even and odd chains), so
// that both directions compute the same bits.
#pragma once

#include "kernels/cuda/backward_common.cuh"

namespace ra_bwd {

// The block's shared memory, carved as ra__cuda_bwd_smem sizes it; lq, lv, lp the padded row
// strides of the Q/K, dO/V and pair tiles. A pass keeps two pair tiles: the key pass P and dZ,
// the query pass dZ transposed (in P's place), the stats pass the logits (in P).
struct tiles {
    ra_smem<float> q, dout, k, v, acc0, acc1, p, dz, dzt, part, db;
    int lq, lv, lp;
};

__device__ __forceinline__ tiles carve(ra_smem<float> sm, int t, int d, int dv, bool key_pass)
{
    tiles s;
    s.lq = d + 4, s.lv = dv + 4, s.lp = ra__cuda_bwd_pair_ld(t, key_pass);
    s.q = sm, s.dout = s.q + t * s.lq, s.k = s.dout + t * s.lv, s.v = s.k + t * s.lq;
    s.acc0 = s.v + t * s.lv, s.acc1 = s.acc0 + t * d;
    // dZ 4 floats further: 4 banks away from P, since at D + D_v = 128 one warp of key_sums
    // reads both at the same element (2-way conflicts when they shared banks)
    s.p = s.acc1 + t * dv, s.dz = s.p + t * s.lp + 4, s.dzt = s.p;
    s.part = s.dz + t * s.lp, s.db = s.part + 8 * t;
    return s;
}

// What a pass takes from the pair tiles (pair_pass).
enum class pairs_for { keys, queries, stats };

// A thread's pairs of a T x T tile: RI query rows by CJ keys, rows ti RI + r and keys
// tj + 16 cj for ti = tid / 16, tj = tid % 16 (the 8 lanes of a quarter warp: one row group,
// 8 consecutive keys).
template <int T> struct pair_shape {
    static constexpr int RI = T == 32 ? 4 : 2, CJ = T == 32 ? 2 : 1;
    static_assert(8 * RI == T && 16 * CJ == T && THREADS == 128, "a T x T tile over 128 threads");
};

// The dot products of the thread's pairs over n columns (a multiple of 4): rows xi of x with
// rows yj of y, as the float32 forward takes them (forward_f32.cuh), x's elements times
// 2^-shift first (SPEC 9). 8 FMA per 16-byte load at T = 32.
template <int RI, int CJ>
__device__ __forceinline__ void tile_dots(ra_smem<float> x, int ldx, const int (&xi)[RI],
                                          ra_smem<float> y, int ldy, const int (&yj)[CJ], int n,
                                          int shift, float (&out)[RI][CJ])
{
    float even[RI][CJ], odd[RI][CJ];
    RA_UNROLL
    for (int r = 0; r < RI; ++r)
        RA_UNROLL
        for (int cj = 0; cj < CJ; ++cj) even[r][cj] = odd[r][cj] = 0.0f;
    const ra_smem<ra_f32x4> x4 = ra_smem_as<ra_f32x4>(x), y4 = ra_smem_as<ra_f32x4>(y);
    for (int c = 0; c < n; c += 4) {
        ra_f32x4 yv[CJ];
        RA_UNROLL
        for (int cj = 0; cj < CJ; ++cj) yv[cj] = y4[(yj[cj] * ldy + c) / 4];
        RA_UNROLL
        for (int r = 0; r < RI; ++r) {
            ra_f32x4 xv = x4[(xi[r] * ldx + c) / 4];
            if (shift) {
                xv.x = ldexpf(xv.x, -shift), xv.y = ldexpf(xv.y, -shift);
                xv.z = ldexpf(xv.z, -shift), xv.w = ldexpf(xv.w, -shift);
            }
            RA_UNROLL
            for (int cj = 0; cj < CJ; ++cj) {
                even[r][cj] = ra_fma(xv.x, yv[cj].x, even[r][cj]);
                odd[r][cj] = ra_fma(xv.y, yv[cj].y, odd[r][cj]);
                even[r][cj] = ra_fma(xv.z, yv[cj].z, even[r][cj]);
                odd[r][cj] = ra_fma(xv.w, yv[cj].w, odd[r][cj]);
            }
        }
    }
    RA_UNROLL
    for (int r = 0; r < RI; ++r)
        RA_UNROLL
        for (int cj = 0; cj < CJ; ++cj) out[r][cj] = even[r][cj] + odd[r][cj];
}

// The query pass's dZ of key j for RI consecutive rows from i0, into the transposed tile as one
// store of RI floats: at T = 32 a quarter warp's 8 keys are 8 rows of 36 floats, 8 distinct
// groups of 4 banks (RI scalar stores put the warp's 32 lanes on 8 banks: 4-way conflicts).
template <int RI>
__device__ __forceinline__ void store_column(const tiles &s, int j, int i0, const float (&dz)[RI])
{
    static_assert(RI == 4 || RI == 2, "a 16- or 8-byte store");
    const int at = j * s.lp + i0; // a multiple of RI: lp and i0 are
    if constexpr (RI == 4) {
        ra_smem_as<ra_f32x4>(s.dzt)[at / 4] = ra_f32x4{dz[0], dz[1], dz[2], dz[3]};
    } else {
        ra_smem_as<ra_f32x2>(s.dzt)[at / 2] = ra_f32x2{dz[0], dz[1]};
    }
}

// SPEC 7 on every pair of the loaded query rows (nq) and keys (nk; positions of key segment
// kseg from index k0), zeros outside: for the key pass P and dZ into the tiles, and with want_db
// the column sums of dS of each row group into s.part; for the query pass dZ transposed; for
// the SPEC 9 stats pass the logits into s.p, -inf outside. FULL: no per-element mask.
template <int T, pairs_for FOR>
__device__ __forceinline__ void pair_pass(const ra_bwd_args &a, const tiles &s, const brow *rows,
                                          int nq, const ra_segment &kseg, int k0, int nk,
                                          bool full, int qshift, bool want_db)
{
    constexpr bool logits_only = FOR == pairs_for::stats;
    using PS = pair_shape<T>;
    const int tid = (int)threadIdx.x, ti = tid / 16, tj = tid % 16;
    int xi[PS::RI], yj[PS::CJ];
    RA_UNROLL
    for (int r = 0; r < PS::RI; ++r) xi[r] = ti * PS::RI + r;
    RA_UNROLL
    for (int cj = 0; cj < PS::CJ; ++cj) yj[cj] = tj + 16 * cj;
    float z[PS::RI][PS::CJ], dp[PS::RI][PS::CJ] = {};
    tile_dots<PS::RI, PS::CJ>(s.q, s.lq, xi, s.k, s.lq, yj, a.f.d, qshift, z);
    if (!logits_only) tile_dots<PS::RI, PS::CJ>(s.dout, s.lv, xi, s.v, s.lv, yj, a.f.dv, 0, dp);
    RA_UNROLL
    for (int cj = 0; cj < PS::CJ; ++cj) {
        const int j = yj[cj];
        const int64_t pj = kseg.span.pos + (int64_t)(k0 + j) * kseg.span.stride, kr = kseg.row + k0 + j;
        float db = 0.0f; // this row group's part of the column's dBias, rows in order
        float dz_col[PS::RI]; // the query pass's dZ of key j, the thread's rows
        RA_UNROLL
        for (int r = 0; r < PS::RI; ++r) {
            const int i = xi[r];
            const bool in = i < nq && j < nk;
            if (logits_only) {
                s.p[i * s.lp + j] = !in   ? -INFINITY
                                    : full ? ra_fwd::logit<false>(a.f, rows[i].rc, z[r][cj], true, pj, kr)
                                           : ra_fwd::logit<true>(a.f, rows[i].rc, z[r][cj], true, pj, kr);
                continue;
            }
            pair_grad g{0.0f, 0.0f, 0.0f};
            if (in)
                g = full ? grads<false>(a, rows[i], z[r][cj], dp[r][cj], pj, kr)
                         : grads<true>(a, rows[i], z[r][cj], dp[r][cj], pj, kr);
            if (FOR == pairs_for::keys) s.p[i * s.lp + j] = g.p, s.dz[i * s.lp + j] = g.dz;
            dz_col[r] = g.dz;
            db += g.ds;
        }
        if (FOR == pairs_for::queries) store_column<PS::RI>(s, j, xi[0], dz_col);
        if (FOR == pairs_for::keys && want_db) s.part[ti * T + j] = db;
    }
    __syncthreads();
}

// sum[a][b] += w[a] x[b] over n steps, in step order: w the 16-byte element w0 + i ws of w4, x
// the element x0 + i xs of x4 at step i (4 x 4 FMA per 2 loads).
__device__ __forceinline__ void outer_sums(ra_smem<ra_f32x4> w4, int w0, int ws, ra_smem<ra_f32x4> x4,
                                           int x0, int xs, int n, float (&sum)[4][4])
{
    for (int i = 0; i < n; ++i) {
        const ra_f32x4 wv = w4[w0 + i * ws];
        const ra_f32x4 xv = x4[x0 + i * xs];
        const float w[4] = {wv.x, wv.y, wv.z, wv.w}, x[4] = {xv.x, xv.y, xv.z, xv.w};
        RA_UNROLL
        for (int r = 0; r < 4; ++r)
            RA_UNROLL
            for (int c = 0; c < 4; ++c) sum[r][c] = ra_fma(w[r], x[c], sum[r][c]);
    }
}

// Rows r of an accumulator, 4 columns from the 16-byte element at + r ld4: += f sum[r].
__device__ __forceinline__ void add_sums(ra_smem<ra_f32x4> acc, int at, int ld4, float f,
                                         const float (&sum)[4][4])
{
    RA_UNROLL
    for (int r = 0; r < 4; ++r) {
        ra_f32x4 o = acc[at + r * ld4];
        o.x += f * sum[r][0], o.y += f * sum[r][1], o.z += f * sum[r][2], o.w += f * sum[r][3];
        acc[at + r * ld4] = o;
    }
}

// The key pass's sums of one query tile (nq rows) into the key tile's accumulators, 4 keys by 4
// columns a thread: dV_j += sum_i P_ij dO_i (s.acc1), dK_j += scale sum_i dZ_ij q_i (s.acc0),
// each sum over i in order; a quarter warp reads one P row's 4 keys (a broadcast) and 8
// consecutive 4-column chunks.
template <int T>
__device__ __forceinline__ void key_sums(const ra_bwd_args &a, const tiles &s, int nq)
{
    const int d = a.f.d, dv = a.f.dv, chunks = (d + dv) / 4;
    for (int b = (int)threadIdx.x; b < T / 4 * chunks; b += THREADS) {
        const int j0 = b / chunks * 4, c0 = b % chunks * 4;
        // dV's columns or dK's: operands chosen per lane, one load instruction either way (at
        // D + D_v = 128 a warp holds both)
        const bool is_v = c0 >= d;
        const int c = is_v ? c0 - d : c0, n = is_v ? dv : d;
        float sum[4][4] = {};
        outer_sums(ra_smem_as<ra_f32x4>(is_v ? s.p : s.dz), j0 / 4, s.lp / 4,
                   ra_smem_as<ra_f32x4>(is_v ? s.dout : s.q), c / 4, (is_v ? s.lv : s.lq) / 4, nq, sum);
        add_sums(ra_smem_as<ra_f32x4>(is_v ? s.acc1 : s.acc0), (j0 * n + c) / 4, n / 4,
                 is_v ? 1.0f : a.f.scale, sum);
    }
}

// The query pass's sums of one key tile (nk keys) into the query tile's dQ (s.acc0), 4 rows by
// 4 columns a thread: dQ_i += scale sum_j dZ_ij k_j, the sum over j in order, dZ read as its
// transpose (4 rows in one load).
template <int T>
__device__ __forceinline__ void query_sums(const ra_bwd_args &a, const tiles &s, int nk)
{
    const int d = a.f.d, chunks = d / 4;
    for (int b = (int)threadIdx.x; b < T / 4 * chunks; b += THREADS) {
        const int i0 = b / chunks * 4, c0 = b % chunks * 4;
        float sum[4][4] = {};
        outer_sums(ra_smem_as<ra_f32x4>(s.dzt), i0 / 4, s.lp / 4, ra_smem_as<ra_f32x4>(s.k), c0 / 4, s.lq / 4, nk, sum);
        add_sums(ra_smem_as<ra_f32x4>(s.acc0), (i0 * d + c0) / 4, d / 4, a.f.scale, sum);
    }
}

} // namespace ra_bwd
