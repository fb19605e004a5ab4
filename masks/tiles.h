/*
 * Tile lists (SPEC 3 classification done once, at plan creation): the tiles of one shard
 * (`mine`, cut into tiles of `block` rows per segment) and, for each, the tiles of another
 * shard (`other`, tiles of `other_block` rows) it meets, as runs of consecutive tiles of one
 * segment and one kind, FULL or PARTIAL; EMPTY tiles are left out. A query-major list (mine:
 * the local queries) drives the forward and the CPU backward on both backends; a key-major one
 * (mine: a key shard) the CUDA backward's key pass. The kernels walk the runs instead of
 * classifying tiles at every call, and take the tiles heaviest first (`order`), so that the
 * longest ones (a causal mask's last query tiles) do not land in the last wave. Internal.
 */
#ifndef RINGATTN_MASKS_TILES_H
#define RINGATTN_MASKS_TILES_H

#include <stddef.h>
#include <stdint.h>

#include "masks/shard.h"
#include "ringattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Consecutive tiles of one segment of `other`, all of one kind. int32 fields: the kernels
   read them as 16-byte records. */
typedef struct ra_tile_run {
    int32_t seg;   /* the segment, of other */
    int32_t first; /* the index in the segment of the run's first row (a multiple of the block) */
    int32_t tiles; /* tiles of other_block rows (the segment's last tile may be shorter) */
    int32_t kind;  /* RA_BLOCK_FULL or RA_BLOCK_PARTIAL */
} ra_tile_run;

/* A tile of mine and its runs, list->runs[run, run + runs). Tiles meeting nothing have none:
   they are listed all the same (a step still carries or finalises their rows' state). */
typedef struct ra_tile_item {
    int32_t seg, first; /* mine's segment, the index in it of the tile's first row */
    int32_t run, runs;
} ra_tile_item;

typedef struct ra_tile_list {
    int block, other_block;
    int32_t num_items, num_runs;
    ra_tile_item *items; /* in tile order: segment by segment, as ra_shard holds them */
    int32_t *seg_item;   /* [mine's segments + 1]: the first item of each segment */
    int32_t *order;      /* [num_items] the items by descending work (pairs of rows and
                            keys the runs hold), ties in tile order */
    int64_t *work;       /* [num_items] that estimate */
    ra_tile_run *runs;
} ra_tile_list;

/*
 * The list of mine against other under window w (delta: SPEC 2's per sequence). mine_is_query:
 * mine holds the queries (the other tiles are keys), else the keys. RINGATTN_ERR_OUT_OF_MEMORY
 * (nothing allocated) without the memory, RINGATTN_ERR_UNSUPPORTED past int32 counts.
 */
ringattn_status_t ra__tile_list_make(ra_window w, const int64_t *delta, const ra_shard *mine,
                                     int mine_is_query, int block, const ra_shard *other,
                                     int other_block, ra_tile_list *out);
void ra__tile_list_free(ra_tile_list *l);
/* Host bytes the list holds. */
size_t ra__tile_list_bytes(const ra_tile_list *l);

/* Item i's tile: its span (positions in its sequence), its first local row; returns its rows. */
static inline int ra__tile_item_span(const ra_tile_list *l, const ra_shard *mine, int32_t i,
                                     ra_span *span, int64_t *row)
{
    const ra_segment *seg = &mine->segs[l->items[i].seg];
    *span = ra__segment_tile(seg, l->items[i].first, l->block);
    *row = seg->row + l->items[i].first;
    return (int)span->count;
}

#ifdef __cplusplus
}
#endif

#endif
