/* SPEC 8 layouts (see layout.h). */
#include "ring/layout.h"

/* Chunk c of n chunks of a sequence of length len: start position and size. */
static ra_span chunk(int32_t seq, int64_t len, int n, int c)
{
    const int64_t base = len / n, extra = len % n;
    const ra_span s = {seq, c * base + (c < extra ? c : extra), 1, base + (c < extra)};
    return s;
}

int ra__layout_spans(ringattn_layout_t layout, int P, int r, int32_t seq, int64_t len,
                     ra_span out[RA_LAYOUT_MAX_SPANS])
{
    ra_span cand[RA_LAYOUT_MAX_SPANS];
    int n = 0;
    if (layout == RINGATTN_LAYOUT_ZIGZAG) { /* chunks r and 2P-1-r of 2P: balances causal work */
        cand[n++] = chunk(seq, len, 2 * P, r);
        cand[n++] = chunk(seq, len, 2 * P, 2 * P - 1 - r);
    } else if (layout == RINGATTN_LAYOUT_STRIPED) { /* token t goes to rank t mod P */
        const ra_span s = {seq, r, P, r < len ? (len - r + P - 1) / P : 0};
        cand[n++] = s;
    } else {
        cand[n++] = chunk(seq, len, P, r);
    }
    int kept = 0;
    for (int i = 0; i < n; ++i)
        if (cand[i].count > 0) out[kept++] = cand[i];
    return kept;
}
