/*
 * The CPU backend's workspace: O(threads x tile) floats, the tile index of each sequence and the
 * backward's D_i of each local query row (H x rows floats, as many as the LSE), made on the
 * first call and kept by the plan (no allocation per call after that).
 */
#include <omp.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"
#include "ring/plan/layout.h"
#include "base/error.h"

int ra__cpu_threads(const struct ringattn_plan *p)
{
    return p->num_threads > 0 ? p->num_threads : omp_get_max_threads();
}

void ra__cpu_workspace_free(struct ra_workspace *ws)
{
    if (!ws) return;
    free(ws->q_first);
    free(ws->k_first);
    free(ws->per_thread);
    free(ws->drow);
    free(ws->slab);
    free(ws);
}

ra_tiling ra__tiling_make(const ra_shard *sh, int block, int64_t *first)
{
    first[0] = 0;
    for (int i = 0; i < sh->num_segs; ++i)
        first[i + 1] = first[i] + (sh->segs[i].span.count + block - 1) / block;
    const ra_tiling t = {block, first[sh->num_segs], first};
    return t;
}

int ra__tiling_tile(const ra_tiling *t, const ra_shard *sh, int64_t tile, ra_span *span,
                    int64_t *row)
{
    int lo = 0, hi = sh->num_segs - 1; /* the segment with first[i] <= tile < first[i + 1] */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (t->first[mid] <= tile) lo = mid;
        else hi = mid - 1;
    }
    const ra_segment *seg = &sh->segs[lo];
    const int64_t off = (tile - t->first[lo]) * t->block, left = seg->span.count - off;
    span->seq = seg->span.seq;
    span->pos = seg->span.pos + off * seg->span.stride;
    span->stride = seg->span.stride;
    span->count = left < t->block ? left : t->block;
    *row = seg->row + off;
    return (int)span->count;
}

/* Carves one thread's buffers out of base; returns the number of floats used. */
static size_t carve(ra_thread_ws *w, float *base, int bq, int bk, int kb, int d, int dv, int hb)
{
    const int dmax = d > dv ? d : dv;
    const size_t sizes[] = {(size_t)bq * d, (size_t)bk * d,  (size_t)bk * dv, (size_t)bq * dv,
                            (size_t)bq * dv, (size_t)bq * bk, (size_t)bq * bk, (size_t)bq * bk,
                            (size_t)bq * dmax, (size_t)kb * d, (size_t)kb * dv, bq, bq,
                            bq, bq, (size_t)(hb > 0 ? hb : 1) * kb, (size_t)kb * d,
                            (size_t)kb * dv, (size_t)kb * d, (size_t)kb * dv, kb, 2 * (size_t)kb,
                            kb, kb, kb, 2 * (size_t)kb, 2 * (size_t)bk, bk, bk, bk,
                            (size_t)bk * d, (size_t)bk * dv, bk};
    float **dst[] = {&w->q,  &w->k,      &w->v,  &w->dout, &w->o, &w->s, &w->dp, &w->tanh_s,
                     &w->acc, &w->dk,    &w->dv, &w->m,    &w->l,
                     (float **)&w->row_begin, (float **)&w->row_end, &w->dbias, &w->kb,
                     &w->vb, &w->dkb, &w->dvb, &w->dbb, (float **)&w->batch_row,
                     (float **)&w->batch_pos, &w->batch_bias, (float **)&w->batch_slot,
                     (float **)&w->order, (float **)&w->part_row, (float **)&w->part_pos,
                     (float **)&w->part_slot, &w->part_bias, &w->dkt, &w->dvt, &w->dbt};
    _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof dst / sizeof dst[0],
                   "one size per buffer");
    size_t used = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        if (base) *dst[i] = base + used;
        used += (sizes[i] + 15) & ~(size_t)15; /* 64-byte aligned buffers */
    }
    return used;
}

static ringattn_status_t workspace_make(struct ringattn_plan *p, int threads,
                                        struct ra_workspace **out)
{
    struct ra_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "ringattn: out of memory (workspace)");
    ws->threads = threads;
    ws->block_q = p->block_q ? p->block_q : RA_CPU_DEFAULT_BLOCK_Q;
    ws->block_k = p->block_k ? p->block_k : RA_CPU_DEFAULT_BLOCK_K;
    /* With a top-k selection the keys pass gathers the few kept keys of a longer key tile, so
       that its tile products stay about block_k wide (SPEC 6 sparsity). */
    ws->keys_block = p->selects ? RA_CPU_SELECT_KEYS_TILES * ws->block_k : ws->block_k;
    const size_t per = carve(&(ra_thread_ws){0}, NULL, ws->block_q, ws->block_k, ws->keys_block,
                             p->head_dim,
                             p->head_dim_v, p->bias_heads);
    const size_t max_segs = (size_t)p->num_seqs * RA_LAYOUT_MAX_SPANS + 1;
    ws->q_first = malloc(max_segs * sizeof(int64_t));
    ws->k_first = malloc(max_segs * sizeof(int64_t));
    ws->per_thread = calloc((size_t)threads, sizeof *ws->per_thread);
    ws->drow = malloc(((size_t)p->num_heads * (size_t)p->q_shard.rows + 1) * sizeof(float));
    ws->slab = aligned_alloc(64, per * threads * sizeof(float));
    if (!ws->q_first || !ws->k_first || !ws->per_thread || !ws->drow || !ws->slab) {
        ra__cpu_workspace_free(ws);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY,
                        "ringattn: out of memory (workspace of %zu bytes)",
                        per * threads * sizeof(float));
    }
    for (int t = 0; t < threads; ++t)
        carve(&ws->per_thread[t], (float *)ws->slab + per * t, ws->block_q, ws->block_k,
              ws->keys_block,
              p->head_dim, p->head_dim_v, p->bias_heads);
    *out = ws;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__cpu_workspace(struct ringattn_plan *p, int threads)
{
    if (p->ws && p->ws->threads >= threads) return RINGATTN_SUCCESS;
    struct ra_workspace *ws = NULL;
    RA_TRY(workspace_make(p, threads, &ws));
    ra__cpu_workspace_free(p->ws);
    p->ws = ws;
    return RINGATTN_SUCCESS;
}
