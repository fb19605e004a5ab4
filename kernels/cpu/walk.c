/* Tile walks: the tiles of one shard that a given tile meets (see cpu.h). */
#include "kernels/cpu/cpu.h"

void ra__walk_begin(ra_tile_walk *w, const ra_kernel_params *p, const ra_tile_list *list,
                    int32_t item, const ra_span *mine, const ra_shard *keys, int32_t *row_begin,
                    int32_t *row_end)
{
    const ra_tile_item *it = &list->items[item];
    *w = (ra_tile_walk){p,         mine, keys, list->other_block, list->runs + it->run,
                        list->runs + it->run + it->runs, 0, row_begin, row_end};
}

int ra__walk_next(ra_tile_walk *w, ra_span *tile, int64_t *row, ra_block_kind *kind)
{
    while (w->run < w->run_end && w->next == w->run->tiles) ++w->run, w->next = 0;
    if (w->run == w->run_end) return 0;
    const ra_segment *seg = &w->keys->segs[w->run->seg];
    const int64_t t0 = w->run->first + (int64_t)w->next++ * w->block;
    *tile = ra__segment_tile(seg, t0, w->block);
    *row = seg->row + t0;
    *kind = (ra_block_kind)w->run->kind;
    /* the kind is the plan's; a PARTIAL tile's mask needs its rows' intervals */
    if (*kind == RA_BLOCK_PARTIAL)
        ra__classify_block(w->p->window, w->p->delta[w->mine->seq], w->mine, tile, w->row_begin,
                           w->row_end);
    return 1;
}

void ra__pieces_begin(ra_key_pieces *k, const ra_kernel_params *p, const ra_dyn_io *io,
                      ra_thread_ws *w, const ra_tile_list *list, int32_t item, const ra_span *qs,
                      int64_t qrow, const ra_shard *ksh, int h)
{
    *k = (ra_key_pieces){.p = p, .io = io, .qs = qs, .qrow = qrow, .qrows = p->queries->rows,
                         .h = h, .bk = list->other_block, .batch = ra__batch_of(w)};
    ra__walk_begin(&k->walk, p, list, item, qs, ksh, w->row_begin, w->row_end);
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
