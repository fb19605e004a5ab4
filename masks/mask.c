/* SPEC 3 masks: exact block classification (see mask.h). */
#include "masks/mask.h"

/* First index k in [0, count] with pos + k * stride >= lo. */
static int64_t first_at_or_above(const ra_span *s, int64_t lo)
{
    if (lo <= s->pos) return 0;
    int64_t k = (lo - s->pos + s->stride - 1) / s->stride;
    return k < s->count ? k : s->count;
}

/* One past the last index k with pos + k * stride <= hi, in [0, count]. */
static int64_t end_at_or_below(const ra_span *s, int64_t hi)
{
    if (hi < s->pos) return 0;
    int64_t k = (hi - s->pos) / s->stride + 1;
    return k < s->count ? k : s->count;
}

/* Index interval of keys that the query at position p may see. */
static void row_interval(ra_window w, int64_t delta, int64_t p, const ra_span *k, int64_t *b,
                         int64_t *e)
{
    *b = w.left >= 0 ? first_at_or_above(k, p + delta - w.left) : 0;
    *e = w.right >= 0 ? end_at_or_below(k, p + delta + w.right) : k->count;
    if (*e < *b) *e = *b;
}

ra_block_kind ra__classify_block(ra_window w, int64_t delta, const ra_span *q, const ra_span *k,
                                 int32_t *row_begin, int32_t *row_end)
{
    int any = 0, all = 1;
    const int same = q->seq == k->seq && k->count > 0;
    for (int64_t a = 0; a < q->count; ++a) {
        int64_t b = 0, e = 0;
        if (same) row_interval(w, delta, q->pos + a * q->stride, k, &b, &e);
        if (row_begin) row_begin[a] = (int32_t)b;
        if (row_end) row_end[a] = (int32_t)e;
        if (e > b) any = 1;
        if (b != 0 || e != k->count) all = 0;
    }
    if (!any) return RA_BLOCK_EMPTY;
    return all ? RA_BLOCK_FULL : RA_BLOCK_PARTIAL;
}

void ra__key_hull(ra_window w, int64_t delta, const ra_span *q, const ra_span *k, int64_t *kbegin,
                  int64_t *kend)
{
    *kbegin = *kend = 0;
    if (q->seq != k->seq || q->count <= 0 || k->count <= 0) return;
    /* The bounds of SPEC 3 grow with the query position: the first query has the lowest lower
       bound, the last one the highest upper bound. */
    int64_t b0, e0, b1, e1;
    row_interval(w, delta, q->pos, k, &b0, &e0);
    row_interval(w, delta, q->pos + (q->count - 1) * q->stride, k, &b1, &e1);
    *kbegin = b0;
    *kend = e1 > b0 ? e1 : b0;
}
