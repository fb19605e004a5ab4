/* SPEC 8 layouts (see layout.h). */
#include <stdlib.h>

#include "base/error.h"
#include "ring/plan/layout.h"
#include "masks/shard.h"

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

ringattn_status_t ra__shard_make(ringattn_layout_t layout, int P, int r, const int32_t *cu,
                                 int num_seqs, ra_shard *out)
{
    ra_shard sh = {0, NULL, NULL, 0};
    sh.segs = malloc(((size_t)num_seqs * RA_LAYOUT_MAX_SPANS + 1) * sizeof *sh.segs);
    sh.seq_first = malloc(((size_t)num_seqs + 1) * sizeof *sh.seq_first);
    if (!sh.segs || !sh.seq_first) {
        ra__shard_free(&sh);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "ringattn: out of memory (shard)");
    }
    for (int s = 0; s < num_seqs; ++s) {
        ra_span spans[RA_LAYOUT_MAX_SPANS];
        const int n = ra__layout_spans(layout, P, r, s, cu[s + 1] - cu[s], spans);
        sh.seq_first[s] = sh.num_segs;
        for (int i = 0; i < n; ++i) {
            sh.segs[sh.num_segs++] = (ra_segment){spans[i], sh.rows};
            sh.rows += spans[i].count;
        }
    }
    sh.seq_first[num_seqs] = sh.num_segs;
    *out = sh;
    return RINGATTN_SUCCESS;
}

void ra__shard_free(ra_shard *sh)
{
    free(sh->segs);
    free(sh->seq_first);
    sh->segs = NULL;
    sh->seq_first = NULL;
}
