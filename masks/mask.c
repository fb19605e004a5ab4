/* SPEC 3 masks: exact block classification (see mask.h). */
#include "masks/mask.h"

ra_block_kind ra__classify_block(ra_window w, int64_t delta, const ra_span *q, const ra_span *k,
                                 int32_t *row_begin, int32_t *row_end)
{
    int any = 0;
    const int same = q->seq == k->seq && k->count > 0;
    for (int64_t a = 0; a < q->count; ++a) {
        int64_t b = 0, e = 0;
        if (same) ra__row_interval(w, delta, q->pos + a * q->stride, k, &b, &e);
        if (row_begin) row_begin[a] = (int32_t)b;
        if (row_end) row_end[a] = (int32_t)e;
        if (e > b) any = 1;
    }
    if (!any) return RA_BLOCK_EMPTY;
    return ra__spans_full(w, delta, q, k) ? RA_BLOCK_FULL : RA_BLOCK_PARTIAL; /* one FULL test */
}
