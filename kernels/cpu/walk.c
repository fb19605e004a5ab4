/* Tile walks: the tiles of one shard that a given tile meets (see cpu.h). */
#include "kernels/cpu/cpu.h"

void ra__walk_begin(ra_tile_walk *w, const struct ringattn_plan *p, const ra_span *mine,
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
        const int64_t delta = w->p->delta[w->mine->seq];
        *kind = w->mine_is_query ? ra__classify_block(w->p->window, delta, w->mine, tile,
                                                      w->row_begin, w->row_end)
                                 : ra__classify_block(w->p->window, delta, tile, w->mine,
                                                      w->row_begin, w->row_end);
        if (*kind != RA_BLOCK_EMPTY) return 1;
    }
}
