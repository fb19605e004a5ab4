/*
 * The guarded online-softmax state of SPEC 4 and the merge of SPEC 5, per query row.
 *
 * Everything here is inline, uses only expf/logf/INFINITY and compiles unchanged for CUDA
 * (RA_HD). The CPU kernels use the pieces (block max, guarded rescale, finalise) around BLAS
 * tile products; ra__state_update is the whole SPEC 4 step for one row, the scalar reference.
 */
#ifndef RINGATTN_KERNELS_SOFTMAX_STATE_H
#define RINGATTN_KERNELS_SOFTMAX_STATE_H

#include <math.h>
#include <stdint.h>

#include "base/host_device.h"

/* SPEC 4: initialise explicitly, never by relying on 0 * old to clear memory. */
RA_HD void ra__state_init(float *m, float *l, float *acc, int dv)
{
    *m = -INFINITY;
    *l = 0.0f;
    for (int c = 0; c < dv; ++c) acc[c] = 0.0f;
}

/*
 * The larger of a and b, NaN when either is NaN. SPEC 9: NaN in an input propagates to the
 * rows it touches. A plain `a > b ? a : b` never picks a NaN: a query row of NaN (every logit
 * NaN) would keep the max at -inf and come out as an empty row, O = 0 and LSE = -inf.
 */
RA_HD float ra__max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

/* Max over a block of logits; -inf for an empty or fully masked block, NaN if one is NaN. */
RA_HD float ra__block_max(const float *s, int n)
{
    float mb = -INFINITY;
    for (int j = 0; j < n; ++j) mb = ra__max_nan(s[j], mb);
    return mb;
}

/*
 * A block max mb taken without regard to NaN (a vectorised max reduction) is -inf also for a
 * block of NaN logits: then the block's NaN, so that the row comes out NaN, never empty (SPEC
 * 9). Only blocks that look empty are scanned.
 */
RA_HD float ra__block_max_or_nan(const float *s, int n, float mb)
{
    if (mb != -INFINITY) return mb; /* finite: a NaN logit beside it makes its p NaN anyway */
    for (int j = 0; j < n; ++j)
        if (s[j] != s[j]) return s[j];
    return mb;
}

/*
 * SPEC 4, the guard. Given the running max *m and the block max mb: when max(m, mb) is -inf the
 * row has seen no allowed key yet, the state must stay as it is and the block contributes
 * nothing (return 0). Otherwise *m becomes the new max, *alpha = exp(m_old - m_new) (exactly 0
 * for m_old = -inf, never NaN since m_new is finite) and 1 is returned.
 */
RA_HD int ra__state_rescale(float *m, float mb, float *alpha)
{
    const float mn = *m > mb ? *m : mb;
    if (mn == -INFINITY) return 0;
    *alpha = expf(*m - mn);
    *m = mn;
    return 1;
}

/* exp(s - m) for a row whose max m is finite: a masked logit (-inf) gives exactly 0. */
RA_HD float ra__prob(float s, float m) { return s == -INFINITY ? 0.0f : expf(s - m); }

/*
 * The whole SPEC 4 update of one row by one block of n keys: s[j] logits, v rows of dv values
 * at v + j * v_stride. Scalar reference (tests, simple kernels).
 */
RA_HD void ra__state_update(float *m, float *l, float *acc, int dv, const float *s, int n,
                            const float *v, int64_t v_stride)
{
    float alpha;
    if (!ra__state_rescale(m, ra__block_max(s, n), &alpha)) return;
    float sum = 0.0f;
    for (int c = 0; c < dv; ++c) acc[c] *= alpha;
    for (int j = 0; j < n; ++j) {
        const float p = ra__prob(s[j], *m);
        if (p == 0.0f) continue; /* masked keys are skipped, never multiplied */
        sum += p;
        for (int c = 0; c < dv; ++c) acc[c] += p * v[j * v_stride + c];
    }
    *l = alpha * *l + sum;
}

/* SPEC 4 finalise, the one rule of both backends: O = acc * ra__state_out_scale(l) and
   LSE = ra__state_lse(m, l); an empty row (l == 0) gives O = 0 exactly and LSE = -inf. The
   CUDA kernels apply the two to their register fragments, whose empty rows hold acc = 0. */
RA_HD float ra__state_out_scale(float l) { return l == 0.0f ? 0.0f : 1.0f / l; }
RA_HD float ra__state_lse(float m, float l) { return l == 0.0f ? -INFINITY : m + logf(l); }

/*
 * SPEC 11: finalise with an attention sink, one more partial (O = 0, LSE = sink) merged into
 * the row's state (m, l) by SPEC 5 at the row's end, once: O = acc * *out_scale, the LSE
 * returned. sink = -inf is no sink (the plain finalise). A row with no allowed key gives O = 0
 * and LSE = sink; a NaN or +inf sink gives NaN (SPEC 9: it propagates, never turns into a
 * number).
 */
RA_HD float ra__state_lse_sink(float m, float l, float sink, float *out_scale)
{
    if (sink == -INFINITY) {
        *out_scale = ra__state_out_scale(l);
        return ra__state_lse(m, l);
    }
    if (sink != sink || sink == INFINITY) {
        *out_scale = sink - sink; /* NaN */
        return *out_scale;
    }
    if (l == 0.0f) {
        *out_scale = 0.0f;
        return sink;
    }
    const float mn = ra__max_nan(m, sink), alpha = expf(m - mn);
    const float total = alpha * l + expf(sink - mn);
    *out_scale = alpha / total;
    return mn + logf(total);
}

/*
 * SPEC 9 and 11: a lossy row's recomputed (m, l) over its keys, with its sink joined the same
 * way, so that P = exp(s - m) / l is the forward's probability. Returns whether the row has a
 * sum to divide by (l > 0). A NaN or +inf sink is left out: its row's LSE is NaN, never lossy.
 */
RA_HD int ra__row_stats_sink(float *m, float *l, float sink)
{
    if (sink == -INFINITY || sink != sink || sink == INFINITY) return *l > 0.0f;
    const float mn = ra__max_nan(*m, sink);
    *l = *l * expf(*m - mn) + expf(sink - mn); /* m = -inf (no key): exactly 0 + 1 */
    *m = mn;
    return 1;
}

/* SPEC 11: the sink's probability in a row whose P = exp(s - shift) * scale; 0 without one. */
RA_HD float ra__sink_prob(float sink, float shift, float scale)
{
    return sink == -INFINITY ? 0.0f : expf(sink - shift) * scale;
}

RA_HD void ra__state_finalize(float m, float l, float sink, const float *acc, int dv, float *o,
                              float *lse)
{
    float scale;
    *lse = ra__state_lse_sink(m, l, sink, &scale);
    /* an empty row: 0 whatever acc (NaN with a NaN sink) */
    for (int c = 0; c < dv; ++c) o[c] = l == 0.0f ? 0.0f * scale : acc[c] * scale;
}

/* An LSE marking an empty partial: -inf (ours, FlashAttention 3) or +inf (FlashAttention 2). */
RA_HD int ra__lse_is_empty(float lse) { return lse == -INFINITY || lse == INFINITY; }

/*
 * SPEC 5 merge weights of n partials of one row: w[s] = exp(LSE_s - M) / W, exactly 0 for an
 * empty partial (whose O must then be skipped, never multiplied: it may be garbage). Writes
 * the merged LSE (-inf when all partials are empty) and returns the number of non-empty ones.
 */
RA_HD int ra__merge_weights(const float *lse, int n, float *w, float *lse_out)
{
    float mx = -INFINITY;
    for (int s = 0; s < n; ++s)
        if (!ra__lse_is_empty(lse[s]) && lse[s] > mx) mx = lse[s];
    int used = 0;
    float total = 0.0f;
    for (int s = 0; s < n; ++s) {
        w[s] = 0.0f;
        if (ra__lse_is_empty(lse[s])) continue;
        w[s] = expf(lse[s] - mx);
        total += w[s];
        ++used;
    }
    if (!used) {
        *lse_out = -INFINITY;
        return 0;
    }
    for (int s = 0; s < n; ++s) w[s] /= total;
    *lse_out = mx + logf(total);
    return used;
}

/*
 * SPEC 5 over n float32 partials of one row taken in order, without per-partial arrays (a GPU
 * thread's form): LSE_s = lse[s * ls], column c of O_s = o[s * os + c]. ra__merge_total finds
 * the largest non-empty LSE (*mx) and returns W = sum exp(LSE_s - mx) (0: every partial empty,
 * then O = 0 and LSE = -inf); ra__merge_column is one column of O: sum (exp(LSE_s - mx) / W) O_s,
 * empty partials skipped, never multiplied (the weights of ra__merge_weights).
 */
RA_HD float ra__merge_total(int n, const float *lse, int64_t ls, float *mx)
{
    float m = -INFINITY, total = 0.0f;
    for (int s = 0; s < n; ++s)
        if (!ra__lse_is_empty(lse[s * ls]) && lse[s * ls] > m) m = lse[s * ls];
    for (int s = 0; s < n; ++s)
        if (!ra__lse_is_empty(lse[s * ls])) total += expf(lse[s * ls] - m);
    *mx = m;
    return total;
}

/*
 * SPEC 11: a sink (its LSE, -inf for none) as one more partial of the merge above, whose O is 0:
 * it joins the max and the total but no column. A NaN or +inf sink makes the total NaN, which
 * callers write as NaN (test total != total: `total > 0` alone would make the row empty).
 */
RA_HD float ra__merge_add_sink(float sink, float *mx, float total)
{
    if (sink == -INFINITY) return total;
    if (sink != sink || sink == INFINITY) return sink - sink;
    if (sink <= *mx) return total + expf(sink - *mx);
    total = total * expf(*mx - sink) + 1.0f; /* total 0 (no partial) stays 0, then + 1 */
    *mx = sink;
    return total;
}

/* SPEC 5 after ra__merge_total (and ra__merge_add_sink): the row's LSE, and a column's value
   where the total is not positive: -inf and 0 (every partial empty), or NaN (a NaN total). */
RA_HD float ra__merge_lse(float mx, float total)
{
    return total > 0.0f ? mx + logf(total) : total != total ? total : -INFINITY;
}
RA_HD float ra__merge_no_column(float total) { return total != total ? total : 0.0f; }

RA_HD float ra__merge_column(int n, const float *lse, int64_t ls, const float *o, int64_t os,
                             float mx, float total)
{
    float sum = 0.0f;
    for (int s = 0; s < n; ++s) {
        if (ra__lse_is_empty(lse[s * ls])) continue;
        sum += expf(lse[s * ls] - mx) / total * o[s * os];
    }
    return sum;
}

#endif
