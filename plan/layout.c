/* SPEC 8 layouts (see layout.h). */
#include <stdlib.h>

#include "base/error.h"
#include "plan/layout.h"
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

/* The spans one shard holds of sequence seq (at most RA_LAYOUT_MAX_SPANS, none empty). */
typedef int (*spans_of_fn)(const void *ctx, int32_t seq, ra_span out[RA_LAYOUT_MAX_SPANS]);

/* A shard of the spans spans_of gives for each sequence, laid end to end in sequence order. */
static ringattn_status_t shard_build(int num_seqs, spans_of_fn spans_of, const void *ctx,
                                     ra_shard *out)
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
        const int n = spans_of(ctx, s, spans);
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

typedef struct layout_ctx {
    ringattn_layout_t layout;
    int P, r;
    const int32_t *cu;
} layout_ctx;

static int layout_spans(const void *ctx, int32_t seq, ra_span out[RA_LAYOUT_MAX_SPANS])
{
    const layout_ctx *c = ctx;
    return ra__layout_spans(c->layout, c->P, c->r, seq, c->cu[seq + 1] - c->cu[seq], out);
}

ringattn_status_t ra__shard_make(ringattn_layout_t layout, int P, int r, const int32_t *cu,
                                 int num_seqs, ra_shard *out)
{
    const layout_ctx c = {layout, P, r, cu};
    return shard_build(num_seqs, layout_spans, &c, out);
}

/* One span per sequence, [first(seq), first(seq) + count(seq)), unless empty. */
typedef struct range_ctx {
    const int32_t *bounds; /* cache bounds: [num_seqs * (P + 1)], rank r's range at r */
    int P, r;
    const int32_t *cu_cache, *cu_new; /* new keys: after the cached ones */
} range_ctx;

static int range_span(const void *ctx, int32_t seq, ra_span out[RA_LAYOUT_MAX_SPANS])
{
    const range_ctx *c = ctx;
    int64_t first, count;
    if (c->bounds) {
        const int32_t *b = c->bounds + (int64_t)seq * (c->P + 1) + c->r;
        first = b[0], count = (int64_t)b[1] - b[0];
    } else {
        first = c->cu_cache[seq + 1] - c->cu_cache[seq];
        count = (int64_t)c->cu_new[seq + 1] - c->cu_new[seq];
    }
    if (count <= 0) return 0;
    out[0] = (ra_span){seq, first, 1, count};
    return 1;
}

ringattn_status_t ra__shard_make_bounds(const int32_t *bounds, int P, int r, int num_seqs,
                                        ra_shard *out)
{
    const range_ctx c = {bounds, P, r, NULL, NULL};
    return shard_build(num_seqs, range_span, &c, out);
}

ringattn_status_t ra__shard_make_new(const int32_t *cu_cache, const int32_t *cu_new, int num_seqs,
                                     ra_shard *out)
{
    const range_ctx c = {NULL, 0, 0, cu_cache, cu_new};
    return shard_build(num_seqs, range_span, &c, out);
}

void ra__shard_free(ra_shard *sh)
{
    free(sh->segs);
    free(sh->seq_first);
    sh->segs = NULL;
    sh->seq_first = NULL;
}
