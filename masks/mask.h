/*
 * The attention mask of SPEC 3 and an exact classifier of (query block, key block) pairs.
 * Internal header (ra__ prefix); the tests include it directly.
 */
#ifndef RINGATTN_MASKS_MASK_H
#define RINGATTN_MASKS_MASK_H

#include <stdint.h>

#include "base/host_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Window (left, right) of SPEC 3, causal already folded in (right = 0); -1 = unbounded. */
typedef struct ra_window {
    int64_t left, right;
} ra_window;

/*
 * A run of tokens of ONE sequence whose positions (counted from the sequence start) are
 * pos, pos + stride, ..., pos + (count - 1) * stride; stride >= 1. Every layout of SPEC 8 cuts
 * a rank's tokens into such runs (contiguous and zigzag: stride 1; striped: stride P).
 */
typedef struct ra_span {
    int32_t seq;
    int64_t pos, stride, count;
} ra_span;

typedef enum ra_block_kind {
    RA_BLOCK_EMPTY = 0,   /* no allowed pair: skip compute (and communication) exactly */
    RA_BLOCK_PARTIAL = 1, /* some pairs allowed: apply the mask per row */
    RA_BLOCK_FULL = 2     /* every pair allowed: no mask evaluation at all */
} ra_block_kind;

/* SPEC 3: may query (seq_i, p_i) see key (seq_j, p_j)? delta = L_k - L_q of the sequence. */
RA_HD int ra__allowed(ra_window w, int64_t delta, int32_t seq_i, int64_t p_i,
                              int32_t seq_j, int64_t p_j)
{
    if (seq_i != seq_j) return 0;
    if (w.left >= 0 && p_j < p_i + delta - w.left) return 0;
    if (w.right >= 0 && p_j > p_i + delta + w.right) return 0;
    return 1;
}

/*
 * Exact classification of every pair (q token a, k token b). Because the allowed keys of one
 * query form an interval of positions and a span's positions increase, they are an index
 * interval [row_begin[a], row_end[a]) of the key span; when row_begin/row_end are non-NULL
 * (q->count entries each) those intervals are written (empty rows get begin == end).
 * O(q->count) time.
 */
ra_block_kind ra__classify_block(ra_window w, int64_t delta, const ra_span *q, const ra_span *k,
                                 int32_t *row_begin, int32_t *row_end);

/* First index k in [0, count] with pos + k * stride >= lo. */
RA_HD int64_t ra__span_first_at_or_above(const ra_span *s, int64_t lo)
{
    if (lo <= s->pos) return 0;
    int64_t k = (lo - s->pos + s->stride - 1) / s->stride;
    return k < s->count ? k : s->count;
}

/* One past the last index k with pos + k * stride <= hi, in [0, count]. */
RA_HD int64_t ra__span_end_at_or_below(const ra_span *s, int64_t hi)
{
    if (hi < s->pos) return 0;
    int64_t k = (hi - s->pos) / s->stride + 1;
    return k < s->count ? k : s->count;
}

/* Index interval [*b, *e) of the keys of span k that the query at position p may see. */
RA_HD void ra__row_interval(ra_window w, int64_t delta, int64_t p, const ra_span *k, int64_t *b,
                            int64_t *e)
{
    *b = w.left >= 0 ? ra__span_first_at_or_above(k, p + delta - w.left) : 0;
    *e = w.right >= 0 ? ra__span_end_at_or_below(k, p + delta + w.right) : k->count;
    if (*e < *b) *e = *b;
}

/*
 * The index interval [*kbegin, *kend) of a key span that any query of span q may see
 * (a hull: keys outside it are masked for every query). O(1). Shared by the CPU and the CUDA
 * kernels (RA_HD).
 */
RA_HD void ra__key_hull(ra_window w, int64_t delta, const ra_span *q, const ra_span *k,
                        int64_t *kbegin, int64_t *kend)
{
    *kbegin = *kend = 0;
    if (q->seq != k->seq || q->count <= 0 || k->count <= 0) return;
    /* The bounds of SPEC 3 grow with the query position: the first query has the lowest lower
       bound, the last one the highest upper bound. */
    int64_t b0, e0, b1, e1;
    ra__row_interval(w, delta, q->pos, k, &b0, &e0);
    ra__row_interval(w, delta, q->pos + (q->count - 1) * q->stride, k, &b1, &e1);
    *kbegin = b0;
    *kend = e1 > b0 ? e1 : b0;
}

/*
 * Is every pair of query span q and key span k allowed (SPEC 3: a FULL block)? Both bounds of
 * a query's interval grow with its position, so the last query's lower bound and the first
 * query's upper bound decide. O(1), RA_HD: the one FULL test, of ra__classify_block and of the
 * CUDA kernels.
 */
RA_HD int ra__spans_full(ra_window w, int64_t delta, const ra_span *q, const ra_span *k)
{
    if (q->seq != k->seq || q->count <= 0 || k->count <= 0) return 0;
    int64_t b0, e0, b1, e1;
    ra__row_interval(w, delta, q->pos, k, &b0, &e0);
    ra__row_interval(w, delta, q->pos + (q->count - 1) * q->stride, k, &b1, &e1);
    return b1 == 0 && e0 == k->count;
}

/*
 * The index interval [*qbegin, *qend) of a query span q that some key of span k is visible to:
 * the same hull with the roles swapped, since allowed(i, j) under window (l, r) and delta is
 * allowed(j, i) under window (r, l) and -delta.
 */
RA_HD void ra__query_hull(ra_window w, int64_t delta, const ra_span *k, const ra_span *q,
                                  int64_t *qbegin, int64_t *qend)
{
    const ra_window t = {w.right, w.left};
    ra__key_hull(t, -delta, k, q, qbegin, qend);
}

#ifdef __cplusplus
}
#endif

#endif
