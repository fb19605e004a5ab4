/* Tile lists: SPEC 3's classification of a shard's tiles against another's, once (tiles.h). */
#include "masks/tiles.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define FN "ringattn_plan_create"

/*
 * The kind of the pair (mine's tile m, other's tile o), o inside m's hull. FULL by the O(1)
 * test. Otherwise, with both strides 1 the tile is PARTIAL: the rows' allowed intervals move
 * by one with each row and are at least one key wide before clamping, so their union is the
 * whole hull and every tile inside it meets some row. Strided runs (the striped layout) can
 * leave gaps under a narrow window: those pairs are classified row by row (and may be EMPTY).
 */
static ra_block_kind pair_kind(ra_window w, int64_t delta, const ra_span *m, const ra_span *o,
                               int mine_is_query)
{
    const ra_span *q = mine_is_query ? m : o, *k = mine_is_query ? o : m;
    if (ra__spans_full(w, delta, q, k)) return RA_BLOCK_FULL;
    if (m->stride == 1 && o->stride == 1) return RA_BLOCK_PARTIAL;
    return ra__classify_block(w, delta, q, k, NULL, NULL);
}

/* A growing array of runs; the item being filled owns those from `open` on. */
typedef struct run_buf {
    ra_tile_run *runs;
    int64_t n, cap, open;
} run_buf;

static int run_push(run_buf *b, int32_t seg, int64_t first, int other_block, ra_block_kind kind)
{
    ra_tile_run *last = b->n > b->open ? &b->runs[b->n - 1] : NULL;
    if (last && last->seg == seg && last->kind == (int32_t)kind &&
        (int64_t)last->first + (int64_t)last->tiles * other_block == first) {
        ++last->tiles;
        return 0;
    }
    if (b->n == b->cap) {
        const int64_t cap = b->cap ? 2 * b->cap : 64;
        ra_tile_run *r = realloc(b->runs, (size_t)cap * sizeof *r);
        if (!r) return -1;
        b->runs = r, b->cap = cap;
    }
    b->runs[b->n++] = (ra_tile_run){seg, (int32_t)first, 1, (int32_t)kind};
    return 0;
}

/* Item i's runs: every tile of other's segments of the same sequence inside the hull. */
static int item_runs(ra_window w, const int64_t *delta, const ra_span *m, int mine_is_query,
                     const ra_shard *other, int other_block, run_buf *b, int64_t *work)
{
    const int64_t d = delta[m->seq];
    *work = 0;
    b->open = b->n;
    for (int32_t s = other->seq_first[m->seq]; s < other->seq_first[m->seq + 1]; ++s) {
        const ra_segment *seg = &other->segs[s];
        int64_t lo, hi;
        if (mine_is_query) ra__key_hull(w, d, m, &seg->span, &lo, &hi);
        else ra__query_hull(w, d, m, &seg->span, &lo, &hi);
        for (int64_t t0 = lo / other_block * other_block; lo < hi && t0 < hi; t0 += other_block) {
            const ra_span o = ra__segment_tile(seg, t0, other_block);
            const ra_block_kind kind = pair_kind(w, d, m, &o, mine_is_query);
            if (kind == RA_BLOCK_EMPTY) continue;
            if (run_push(b, s, t0, other_block, kind)) return -1;
            *work += m->count * o.count;
        }
    }
    return 0;
}

/* Descending work, then ascending item. */
typedef struct weighed {
    int64_t work;
    int32_t item;
} weighed;

static int heavier_first(const void *a, const void *b)
{
    const weighed *x = a, *y = b;
    if (x->work != y->work) return x->work > y->work ? -1 : 1;
    return (x->item > y->item) - (x->item < y->item);
}

ringattn_status_t ra__tile_list_make(ra_window w, const int64_t *delta, const ra_shard *mine,
                                     int mine_is_query, int block, const ra_shard *other,
                                     int other_block, ra_tile_list *out)
{
    memset(out, 0, sizeof *out);
    int64_t items = 0;
    for (int s = 0; s < mine->num_segs; ++s) items += (mine->segs[s].span.count + block - 1) / block;
    RA_CHECK(items < INT32_MAX, RINGATTN_ERR_UNSUPPORTED,
             FN ": %lld tiles of %d rows, expected fewer than 2^31", (long long)items, block);
    out->block = block, out->other_block = other_block, out->num_items = (int32_t)items;
    out->items = malloc((size_t)(items ? items : 1) * sizeof *out->items);
    out->seg_item = malloc(((size_t)mine->num_segs + 1) * sizeof *out->seg_item);
    out->order = malloc((size_t)(items ? items : 1) * sizeof *out->order);
    out->work = malloc((size_t)(items ? items : 1) * sizeof *out->work);
    weighed *by_work = malloc((size_t)(items ? items : 1) * sizeof *by_work);
    run_buf runs = {NULL, 0, 0, 0};
    int failed = !out->items || !out->seg_item || !out->order || !out->work || !by_work;
    int32_t i = 0;
    for (int s = 0; !failed && s < mine->num_segs; ++s) {
        out->seg_item[s] = i;
        for (int64_t t0 = 0; !failed && t0 < mine->segs[s].span.count; t0 += block, ++i) {
            const ra_span m = ra__segment_tile(&mine->segs[s], t0, block);
            const int64_t run0 = runs.n;
            failed = item_runs(w, delta, &m, mine_is_query, other, other_block, &runs,
                               &out->work[i]) != 0;
            out->items[i] = (ra_tile_item){s, (int32_t)t0, (int32_t)run0, (int32_t)(runs.n - run0)};
            by_work[i] = (weighed){out->work[i], i};
            failed = failed || runs.n >= INT32_MAX;
        }
    }
    if (!failed) out->seg_item[mine->num_segs] = i;
    out->runs = runs.runs, out->num_runs = (int32_t)runs.n;
    if (failed) {
        const int too_many = runs.n >= INT32_MAX;
        free(by_work);
        ra__tile_list_free(out);
        RA_CHECK(!too_many, RINGATTN_ERR_UNSUPPORTED,
                 FN ": more than 2^31 runs of tiles, expected fewer (larger tiles)");
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory for the tile lists");
    }
    qsort(by_work, (size_t)items, sizeof *by_work, heavier_first);
    for (int32_t j = 0; j < out->num_items; ++j) out->order[j] = by_work[j].item;
    free(by_work);
    return RINGATTN_SUCCESS;
}

void ra__tile_list_free(ra_tile_list *l)
{
    free(l->items);
    free(l->seg_item);
    free(l->order);
    free(l->work);
    free(l->runs);
    memset(l, 0, sizeof *l);
}

size_t ra__tile_list_bytes(const ra_tile_list *l)
{
    return (size_t)l->num_items * (sizeof *l->items + sizeof *l->order + sizeof *l->work) +
           (size_t)l->num_runs * sizeof *l->runs;
}
