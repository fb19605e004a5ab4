/* Tile walks: the tiles of one shard that a given tile meets (see cpu.h). */
#include "kernels/cpu/cpu.h"

void ra__walk_begin(ra_tile_walk *w, const ra_kernel_params *p, const ra_span *mine,
                    int mine_is_query, const ra_shard *other, int block, int32_t *row_begin,
                    int32_t *row_end)
{
    *w = (ra_tile_walk){p,         mine, mine_is_query, other, block, other->seq_first[mine->seq],
                        0,         other->seq_first[mine->seq + 1], 0, 0, row_begin, row_end};
    w->seg = w->seg_first - 1; /* ra__walk_next opens the first segment */
}

/* Opens the next segment of the other shard: the tile-aligned start and end of its hull. */
static int open_segment(ra_tile_walk *w)
{
    if (++w->seg >= w->seg_end) return 0;
    const ra_span *span = &w->other->segs[w->seg].span;
    const int64_t delta = w->p->delta[w->mine->seq];
    int64_t b, e;
    if (w->mine_is_query) ra__key_hull(w->p->window, delta, w->mine, span, &b, &e);
    else ra__query_hull(w->p->window, delta, w->mine, span, &b, &e);
    w->next = b / w->block * w->block;
    w->end = e;
    return 1;
}

int ra__walk_next(ra_tile_walk *w, ra_span *tile, int64_t *row, ra_block_kind *kind)
{
    for (;;) {
        if (w->seg < w->seg_first || w->next >= w->end) {
            if (!open_segment(w)) return 0;
            continue;
        }
        const ra_segment *seg = &w->other->segs[w->seg];
        const int64_t t0 = w->next, left = seg->span.count - t0;
        w->next += w->block;
        *tile = (ra_span){seg->span.seq, seg->span.pos + t0 * seg->span.stride, seg->span.stride,
                          left < w->block ? left : w->block};
        *row = seg->row + t0;
        /* FULL by the O(1) test (masks/mask.h), which needs no row intervals; the rows of
           any other tile are classified, since a PARTIAL tile's mask uses their intervals */
        const int64_t delta = w->p->delta[w->mine->seq];
        const ra_span *q = w->mine_is_query ? w->mine : tile, *k = w->mine_is_query ? tile : w->mine;
        *kind = ra__spans_full(w->p->window, delta, q, k)
                    ? RA_BLOCK_FULL
                    : ra__classify_block(w->p->window, delta, q, k, w->row_begin, w->row_end);
        if (*kind != RA_BLOCK_EMPTY) return 1;
    }
}

void ra__pieces_begin(ra_key_pieces *k, const ra_kernel_params *p, const ra_dyn_io *io,
                      ra_thread_ws *w, const ra_span *qs, int64_t qrow, const ra_shard *ksh,
                      int h, int bk)
{
    *k = (ra_key_pieces){.p = p, .io = io, .qs = qs, .qrow = qrow, .qrows = p->queries->rows,
                         .h = h, .bk = bk, .batch = ra__batch_of(w)};
    ra__walk_begin(&k->walk, p, qs, 1, ksh, bk, w->row_begin, w->row_end);
}

ra_piece ra__pieces_next(ra_key_pieces *k)
{
    const int nq = (int)k->qs->count;
    if (k->batch_out) k->batch.n = 0, k->batch_out = 0; /* the caller is done with it */
    for (;;) {
        if (k->filling) {
            if (ra__batch_fill(&k->batch, k->bk, &k->ks, k->krow, k->dyn.bias, k->dyn.tmin, &k->j))
                return k->batch_out = 1, RA_PIECE_BATCH; /* full */
            k->filling = 0;
        }
        if (!ra__walk_next(&k->walk, &k->ks, &k->krow, &k->kind))
            return k->batch.n ? (k->batch_out = 1, RA_PIECE_BATCH) : RA_PIECE_END;
        const int nk = (int)k->ks.count;
        if (!ra__tile_dyn(k->p, k->io, k->h, k->qrow, nq, k->qrows, k->krow, nk, &k->dyn,
                          &k->use))
            continue; /* no row keeps any key of it: skipped exactly */
        if (!k->use || !k->use->thr_b) return RA_PIECE_TILE;
        k->sel = k->dyn; /* the rows' thresholds, for the batches */
        if (k->dyn.whole) { /* every row keeps every key: the plain path with the bias */
            k->dyn.thr_b = NULL, k->dyn.thr_p = NULL;
            return RA_PIECE_TILE;
        }
        k->j = 0; /* gather the keys some row may keep: bias >= the rows' lowest threshold */
        k->filling = 1;
    }
}
