// The tensor-core forward kernel's softmax (forward_tile.cuh): the rows' running state of SPEC 4
// carried between ring steps, a PARTIAL tile's mask (SPEC 3) and the guarded update of one key
// tile in the kernel's units (p = 2^(x c - m log2(e)), one FFMA and one MUFU.EX2 per element).
#pragma once

#include "kernels/cuda/forward_tile_layout.cuh"

namespace ra_fwd {

// The running state of SPEC 4 of a lane's rows: the accumulators, the max (a logit) and the
// sum, and a PARTIAL tile's key interval of each row, all in registers. A row's sum (once
// reduced over the quad) and its interval are the same in the 4 lanes of its quad, so each lane
// keeps one row's: lane t of a quad those of its rows (mt, hh) with 2 mt + hh = t (at most 4 rows
// a lane), read by the others through a shuffle. At D_v = 128 the accumulators (128 registers)
// and S (64) leave no room for 4 of each a lane, and in shared memory the sums alone were 2
// bytes read per mma.
template <int MT, int DV> struct rows_state {
    static_assert(MT * 2 <= 4, "one row per lane of a quad");
    float o[MT][DV / 8][4];
    float m[MT][2];
    float l;         // the sum of the row this lane keeps (keeps)
    uint32_t bounds; // its key interval in a PARTIAL tile (keys_of_row)
    // the lane of a quad that keeps the sum and interval of rows (mt, hh), and the rows a lane
    // keeps (its index t = 2 mt + hh; lanes t >= 2 MT keep none)
    __device__ __forceinline__ static int keeper(int mt, int hh) { return mt * 2 + hh; }
    __device__ __forceinline__ static bool keeps(const lane_at &ln, int mt, int hh)
    {
        return ln.t == keeper(mt, hh);
    }
    __device__ __forceinline__ static int kept_row(const lane_at &ln)
    {
        return tile_row<MT>(ln, ln.t >> 1, ln.t & 1);
    }
    // the sum and the interval of rows (mt, hh), in every lane of the quad (all 32 lanes call)
    __device__ __forceinline__ float sum_of(const lane_at &ln, int mt, int hh) const
    {
        return from_keeper(ln, l, mt, hh);
    }
    __device__ __forceinline__ uint32_t bounds_of(const lane_at &ln, int mt, int hh) const
    {
        return from_keeper(ln, bounds, mt, hh);
    }
    template <class T>
    __device__ __forceinline__ static T from_keeper(const lane_at &ln, T kept, int mt, int hh)
    {
        return __shfl_sync(0xffffffffu, kept, (ln.lane & ~3) | keeper(mt, hh));
    }
};

// The units of the scores: p = 2^(x c - m c), m c the max in log2 units; a logit is x cn.
struct score_scale {
    float c, cn;
};

template <bool FULL_FEATURES>
__device__ __forceinline__ score_scale scale_of(const ra_attn_args &a, int qshift)
{
    const float ln2e = 1.4426950408889634f;
    if (FULL_FEATURES) return score_scale{ln2e, 1.0f}; // logit() applies scale and shift
    const float cn = ldexpf(a.scale, qshift);
    return score_scale{cn * ln2e, cn};
}

// The rows' state: carried from the previous ring step (m in logit units), or fresh. A carried
// sum goes to the lane that keeps it.
template <int MT, int DV>
__device__ __forceinline__ void load_state(const ra_attn_args &a, const block_at &b,
                                           const lane_at &ln, rows_state<MT, DV> &st)
{
    st.l = 0.0f;
    RA_UNROLL
    for (int mt = 0; mt < MT; ++mt)
        RA_UNROLL
        for (int hh = 0; hh < 2; ++hh) {
            const int row = tile_row<MT>(ln, mt, hh);
            const int64_t at = (int64_t)b.h * a.tq + b.first_row + row;
            const bool carried = row < b.rows && !a.first;
            st.m[mt][hh] = carried ? a.m[at + b.zstate] : -INFINITY;
            if (carried && st.keeps(ln, mt, hh)) st.l = a.l[at + b.zstate];
            RA_UNROLL
            for (int n = 0; n < DV / 8; ++n)
                RA_UNROLL
                for (int c = 0; c < 2; ++c) {
                    const int col = n * 8 + 2 * ln.t + c;
                    st.o[mt][n][2 * hh + c] =
                        carried && col < b.dv ? a.acc[at * a.dv + b.v0 + col] : 0.0f;
                }
        }
}

// A query row's allowed keys in a key tile (SPEC 3): the index interval [lo, end) of the tile's
// keys, packed as lo | end << 16 (at most 64 keys a tile), so that a row's mask takes one word
// per tile; empty for a row past the query tile. masks/mask.h's ra__row_interval, with the
// bounds clamped to the tile first so that the division by the stride is 32-bit (a 64-bit
// division is a call, which would spill the accumulators' neighbours), and none at stride 1.
__device__ __forceinline__ uint32_t keys_of_row(const ra_attn_args &a, int64_t qpos, int64_t delta,
                                                bool live, const ra_span &ks)
{
    if (!live) return 0;
    const int64_t diag = qpos + delta - ks.pos, span = ks.count * ks.stride; // offsets in the tile
    int64_t lo = a.window.left >= 0 ? diag - a.window.left : 0;
    int64_t hi = a.window.right >= 0 ? diag + a.window.right : span;
    lo = lo < 0 ? 0 : lo > span ? span : lo;
    hi = hi < -1 ? -1 : hi > span ? span : hi;
    const int st = (int)ks.stride, l32 = (int)lo, h32 = (int)hi;
    int b = st == 1 ? l32 : (l32 + st - 1) / st, e = h32 < 0 ? 0 : (st == 1 ? h32 : h32 / st) + 1;
    e = e > (int)ks.count ? (int)ks.count : e;
    b = b > e ? e : b;
    return (uint32_t)b | (uint32_t)e << 16;
}

// The key interval of the row this lane keeps in a PARTIAL key tile (none for a FULL one), and
// whether any row of the warp has a key in the tile: a warp without one skips the tile, which
// leaves its state exactly as the tile would (every p = 0: the max, the sum and the accumulators
// unchanged) and spares its fragments' loads and mma (the diagonal tiles of a causal mask).
template <int BQ, int MT, int BK, int DV>
__device__ __forceinline__ bool tile_bounds(const ra_attn_args &a, const lane_at &ln,
                                            const key_tile &kt, rows_state<MT, DV> &st)
{
    if (kt.full) return true;
    ra_span qt;
    int64_t first_row;
    query_tile(a, (int)blockIdx.x, BQ, &qt, &first_row);
    const ra_segment kseg = a.ksegs[kt.seg];
    const ra_span ks = ra__segment_tile(&kseg, kt.k0, BK);
    const int row = st.kept_row(ln);
    const bool kept = ln.t < MT * 2;
    st.bounds = keys_of_row(a, qt.pos + row * qt.stride, a.delta[qt.seq], kept && row < qt.count, ks);
    return __any_sync(0xffffffffu, (st.bounds >> 16) > (st.bounds & 0xffffu)) != 0;
}

// SPEC 3's mask and SPEC 4's guarded update of the lane's rows by one key tile: S becomes
// P = 2^(x c - m c) in place, the sums and accumulators rescaled. A PARTIAL tile's masked pairs
// get x = -inf (p = 0): an int32 compare of each key's offset with its row's bounds, found once
// per row and tile; a FULL tile has none. A row with no allowed key yet keeps m = -inf and gets
// p = 0 (the max taken as 0 in the exponent, never -inf - -inf). NaN propagates through the sum
// and the accumulators (SPEC 9): the max skips it (fmaxf), its p does not. The query tile's
// place is loaded here, where a tile needs it, rather than held in registers through the loop.
template <bool FULL_FEATURES, int BQ, int MT, int BK, int DV>
__device__ __forceinline__ void softmax_update(const ra_attn_args &a, const lane_at &ln,
                                               const key_tile &kt, int qshift, score_scale sc,
                                               rows_state<MT, DV> &st, float (&s)[MT][BK / 8][4])
{
    const float ln2e = 1.4426950408889634f;
    const bool masked = !kt.full;
    if (!FULL_FEATURES && masked) { // the plain kernel's mask: a pass of its own over S
        RA_UNROLL
        for (int mt = 0; mt < MT; ++mt)
            RA_UNROLL
            for (int hh = 0; hh < 2; ++hh) {
                const uint32_t bounds = st.bounds_of(ln, mt, hh);
                const int lo = (int)(bounds & 0xffffu), end = (int)(bounds >> 16);
                RA_UNROLL
                for (int n = 0; n < BK / 8; ++n)
                    RA_UNROLL
                    for (int cc = 0; cc < 2; ++cc) {
                        const int j = n * 8 + 2 * ln.t + cc;
                        if (j < lo || j >= end) s[mt][n][2 * hh + cc] = -INFINITY;
                    }
            }
    }
    ra_span qt{}, ks{};
    int64_t first_row = 0, delta = 0;
    ra_segment kseg{};
    if (FULL_FEATURES) { // the logit's positions, bias rows and thresholds
        query_tile(a, (int)blockIdx.x, BQ, &qt, &first_row);
        delta = a.delta[qt.seq];
        kseg = a.ksegs[kt.seg];
        ks = ra__segment_tile(&kseg, kt.k0, BK);
    }
    RA_UNROLL
    for (int mt = 0; mt < MT; ++mt)
        RA_UNROLL
        for (int hh = 0; hh < 2; ++hh) {
            row_ctx rc{};
            if (FULL_FEATURES) {
                const int row = tile_row<MT>(ln, mt, hh);
                rc = make_row(a, (int)blockIdx.y, first_row + row, qt.pos + row * qt.stride, delta,
                              row < qt.count, qshift);
            }
            const uint32_t bounds = FULL_FEATURES && masked ? st.bounds_of(ln, mt, hh) : 0u;
            const int lo = (int)(bounds & 0xffffu), end = (int)(bounds >> 16);
            float mb = -INFINITY;
            RA_UNROLL
            for (int n = 0; n < BK / 8; ++n)
                RA_UNROLL
                for (int cc = 0; cc < 2; ++cc) {
                    float &x = s[mt][n][2 * hh + cc];
                    if (FULL_FEATURES) { // a masked tile's logit checks the top-k selection too
                        const int j = n * 8 + 2 * ln.t + cc;
                        const bool in = !masked || (j >= lo && j < end);
                        const int64_t pj = ks.pos + j * ks.stride, kr = kseg.row + kt.k0 + j;
                        x = !in      ? -INFINITY
                            : masked ? logit<true>(a, rc, x, true, pj, kr)
                                     : logit<false>(a, rc, x, true, pj, kr);
                    }
                    mb = fmaxf(mb, x);
                }
            mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, 1));
            mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, 2));
            // the max in logit units (mb's: scores times cn), so that the state carried between
            // steps is the kernel's own, bit for bit
            const float mo = st.m[mt][hh], mn = fmaxf(mo, ra_mul_rn(mb, sc.cn));
            const bool none = mn == -INFINITY; // no allowed key yet: nothing changes
            const float mc = none ? 0.0f : mn * ln2e;
            float sum = 0.0f;
            if (fabsf(mc) < 64.0f) { // the one FFMA: mc's rounding moves p by at most 1.3e-6
                RA_UNROLL
                for (int n = 0; n < BK / 8; ++n)
                    RA_UNROLL
                    for (int cc = 0; cc < 2; ++cc) {
                        float &x = s[mt][n][2 * hh + cc];
                        x = ra_exp2(fmaf(x, sc.c, -mc));
                        sum += x;
                    }
            } else { // logits far from 0 (SPEC 10 case 4: -1e30): the rounded logit minus its
                     // max first, 0 for the max itself (mn is the same rounding of the same value)
                RA_UNROLL
                for (int n = 0; n < BK / 8; ++n)
                    RA_UNROLL
                    for (int cc = 0; cc < 2; ++cc) {
                        float &x = s[mt][n][2 * hh + cc];
                        x = ra_exp2((ra_mul_rn(x, sc.cn) - mn) * ln2e);
                        sum += x;
                    }
            }
            // the row's sum over the quad at every tile: the same bits whatever steps split it
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            float alpha = 1.0f;
            if (!none && mn != mo) { // the max moved: rescale (alpha is 1 exactly otherwise)
                alpha = ra_exp2((mo - mn) * ln2e); // 0 for mo = -inf
                RA_UNROLL
                for (int n = 0; n < DV / 8; ++n)
                    RA_UNROLL
                    for (int cc = 0; cc < 2; ++cc) st.o[mt][n][2 * hh + cc] *= alpha;
                st.m[mt][hh] = mn;
            }
            if (st.keeps(ln, mt, hh)) st.l = alpha * st.l + sum;
        }
}

} // namespace ra_fwd
