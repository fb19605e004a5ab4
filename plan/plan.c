/*
 * Plans made and freed (ringattn_plan_create / _destroy, api/plan.c). Creation validates the
 * descriptor (check.c), agrees on it across the ring (agree.c), then makes everything a call
 * needs -- token maps, schedule, kernel params, the backend's workspace and the ring's buffers
 * -- so that no call allocates.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "plan/agree.h"
#include "plan/buffers.h"
#include "plan/check.h"
#include "plan/grid.h"
#include "plan/info.h"
#include "plan/layout.h"
#include "plan/plan.h"
#include "plan/select.h"

#define FN "ringattn_plan_create"

ringattn_status_t ra__plan_check(const char *fn, const struct ringattn_plan *plan)
{
    RA_CHECK(plan != NULL, RINGATTN_ERR_INVALID_ARGUMENT, "%s: plan: got NULL, expected a plan",
             fn);
    RA_CHECK(ra__registry_contains(plan), RINGATTN_ERR_INVALID_USAGE,
             "%s: plan: got %p, expected a live plan (destroyed or never created)", fn,
             (void *)plan);
    return RINGATTN_SUCCESS;
}

/* Host memory of a copied array, counted in the plan's host bytes. */
static void *plan_copy(struct ringattn_plan *p, const void *src, size_t bytes)
{
    void *dst = malloc(bytes ? bytes : 1);
    if (dst && bytes) memcpy(dst, src, bytes);
    p->host_bytes += bytes;
    return dst;
}

/* Can the ring's buffers go? Not while a transport may still run over them after a failure
   (comm/comm.h). */
static int buffers_free_to_go(struct ringattn_plan *p)
{
    return ra__comm_buffers_free_to_go(p->comm, p->pinned, "the ring's buffers",
                                       p->buf ? p->buf->bytes + p->buf->host_bytes : (size_t)0,
                                       p->rank, p->ranks);
}

static void plan_free(struct ringattn_plan *p)
{
    const int previous = ra__device_enter(p);
    if (p->ws) p->be->workspace_destroy(p->ws);
    if (p->be && buffers_free_to_go(p)) ra__buffers_free(p);
    ra__device_leave(p, previous);
    ra__select_free(p->select);
    for (int r = 0; p->shards && r < p->num_shards; ++r) ra__shard_free(&p->shards[r]);
    for (int r = 0; p->tiles && r < p->num_shards; ++r) ra__tile_list_free(&p->tiles[r]);
    free(p->tiles);
    free(p->shards);
    ra__shard_free(&p->queries);
    free(p->step_compute);
    free(p->last_hop);
    free(p->delta);
    free(p->cu_q);
    free(p->cu_k);
    free(p->cu_cache);
    free(p->cu_new);
    free(p->cache_bounds);
    free(p->part_slot);
    free(p->alibi);
    free(p);
}

/*
 * The tokens as shards (SPEC 8): on one rank the keys of cu_seqlens_k and the queries of
 * cu_seqlens, one segment per sequence; in a ring every rank's tokens under the layout, this
 * rank's shard being both its queries and its keys.
 */
static ringattn_status_t plan_shards(struct ringattn_plan *p)
{
    const int n = p->kp.num_seqs;
    p->num_shards = p->ranks + (p->cu_new != NULL);
    p->shards = calloc((size_t)p->num_shards, sizeof *p->shards);
    RA_CHECK(p->shards, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    RA_TRY(p->kind->shards(p));
    p->kp.num_key_shards = p->num_shards;
    p->kp.key_shards = p->shards;
    /* the state runs between a ring's steps, or into a KV cache's partials (SPEC 4, 5) */
    p->kp.carries_state = p->num_shards > 1 || p->kind->partials;
    p->kp.forward_only = p->kind->backward == NULL;
    /* ra__shard_make's arrays: segments of up to two spans per sequence, seq_first */
    p->host_bytes += (size_t)(p->num_shards + !p->comm) *
                     (((size_t)n * 2 + 1) * sizeof(ra_segment) + ((size_t)n + 1) * sizeof(int32_t));
    return RINGATTN_SUCCESS;
}

/* The local queries' tiles against every key shard's, in the tiles the backend chose
   (masks/tiles.h): the classification of SPEC 3 once, for every call's kernels. */
static ringattn_status_t plan_tiles(struct ringattn_plan *p)
{
    p->tiles = calloc((size_t)p->num_shards, sizeof *p->tiles);
    RA_CHECK(p->tiles, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    p->host_bytes += (size_t)p->num_shards * sizeof *p->tiles;
    for (int s = 0; s < p->num_shards; ++s) {
        RA_TRY(ra__tile_list_make(p->kp.window, p->delta, p->kp.queries, 1, p->kp.block_q,
                                  &p->shards[s], p->kp.block_k, &p->tiles[s]));
        p->host_bytes += ra__tile_list_bytes(&p->tiles[s]);
    }
    p->kp.key_tiles = p->tiles;
    return RINGATTN_SUCCESS;
}

/* The kernel params of the validated descriptor d (SPEC 2-3 defaults folded in). */
static void params_fill(ra_kernel_params *k, const ringattn_plan_desc_t *d)
{
    k->num_heads = d->num_heads;
    k->num_kv_heads = d->num_kv_heads ? d->num_kv_heads : d->num_heads;
    k->head_dim = d->head_dim;
    k->head_dim_v = d->head_dim_v ? d->head_dim_v : d->head_dim;
    k->dtype = d->dtype;
    k->num_seqs = d->num_seqs;
    k->window.left = d->window_left;
    k->window.right = d->causal ? 0 : d->window_right;
    k->scale = d->softmax_scale > 0.0f ? d->softmax_scale : 1.0f / sqrtf((float)d->head_dim);
    k->softcap = d->softcap;
    k->high_precision = d->precision == RINGATTN_PRECISION_HIGH;
    k->bias_heads = d->key_bias_heads;
    k->block_q = d->block_q;
    k->block_k = d->block_k;
    k->num_threads = d->num_threads;
    k->device = d->device;
}

/* The descriptor's arrays, owned: cu_seqlens (_k, _new), delta of SPEC 2, ALiBi slopes. */
static ringattn_status_t plan_arrays(struct ringattn_plan *p, const ringattn_plan_desc_t *d)
{
    const size_t n = (size_t)d->num_seqs;
    p->cu_q = plan_copy(p, d->cu_seqlens, (n + 1) * sizeof(int32_t));
    p->cu_cache = plan_copy(p, d->cu_seqlens_k ? d->cu_seqlens_k : d->cu_seqlens,
                            (n + 1) * sizeof(int32_t));
    RA_CHECK(p->cu_cache, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    p->cu_k = plan_copy(p, p->cu_cache, (n + 1) * sizeof(int32_t));
    if (d->cu_seqlens_new) {
        p->cu_new = plan_copy(p, d->cu_seqlens_new, (n + 1) * sizeof(int32_t));
        RA_CHECK(p->cu_new, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    }
    if (d->cache_bounds) {
        p->cache_bounds =
            plan_copy(p, d->cache_bounds, n * ((size_t)p->ranks + 1) * sizeof(int32_t));
        RA_CHECK(p->cache_bounds, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    }
    RA_CHECK(p->cu_k, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    for (size_t s = 0; p->cu_new && s < n; ++s) /* every key: the cached then the new */
        p->cu_k[s + 1] = p->cu_k[s] + (p->cu_cache[s + 1] - p->cu_cache[s]) +
                         (p->cu_new[s + 1] - p->cu_new[s]);
    p->alibi = d->alibi_slopes
                   ? plan_copy(p, d->alibi_slopes, (size_t)d->num_heads * sizeof(float))
                   : NULL;
    p->delta = malloc((n + 1) * sizeof *p->delta);
    p->host_bytes += (n + 1) * sizeof *p->delta;
    RA_CHECK(p->cu_q && p->cu_k && p->delta && (p->alibi || !d->alibi_slopes),
             RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory copying the descriptor");
    for (size_t s = 0; s < n; ++s) {
        const int32_t lk = p->cu_k[s + 1] - p->cu_k[s];
        p->delta[s] = (int64_t)lk - (p->cu_q[s + 1] - p->cu_q[s]);
        p->longest_k = lk > p->longest_k ? lk : p->longest_k;
    }
    p->kp.delta = p->delta;
    p->kp.alibi = p->alibi;
    return RINGATTN_SUCCESS;
}

static ringattn_status_t plan_fill(struct ringattn_plan *p, ringattn_comm_t comm,
                                   const ringattn_plan_desc_t *d, const struct ra_backend *be,
                                   const ra_plan_kinds *kinds)
{
    p->comm = comm;
    p->rank = comm ? comm->rank : 0;
    p->id = comm ? comm->calls : 0; /* the agreement just numbered this call */
    p->ranks = comm ? comm->size : 1;
    p->layout = d->layout;
    p->be = be;
    p->device = d->device;
    p->keep_k = d->keep_k;
    p->kind = d->sharded_cache || d->cu_seqlens_new ? kinds->cache : kinds->ring;
    p->new_shard = d->cu_seqlens_new ? p->ranks : -1;
    params_fill(&p->kp, d);
    RA_TRY(plan_arrays(p, d));
    /* SPEC 6: a row with at most keep_k valid keys keeps them all, so keep_k >= every sequence's
       length is no selection at all, and is computed as such (bitwise as keep_k = 0). */
    p->kp.selects = p->keep_k > 0 && p->keep_k < p->longest_k;
    RA_TRY(plan_shards(p));
    RA_TRY(be->prepare(&p->kp));
    p->device = p->kp.device; /* resolved: -1 became the current device */
    RA_TRY(p->kind->schedule(p));
    RA_TRY(plan_tiles(p));
    RA_TRY(ra__select_make(p));
    const int previous = ra__device_enter(p); /* the buffers live on the plan's device */
    ringattn_status_t st = p->kind->buffers(p);
    if (st == RINGATTN_SUCCESS) st = be->workspace_create(&p->kp, &p->ws, &p->ws_bytes);
    ra__device_leave(p, previous);
    return st;
}

ringattn_status_t ra__plan_create(ringattn_comm_t comm, const ringattn_plan_desc_t *desc,
                                  const ra_plan_kinds *kinds, ringattn_plan_t *plan)
{
    if (comm != NULL && !ra__registry_contains(comm)) {
        ra__comm_refused(); /* no comm to agree over: the next agreement carries it */
        return ra__fail(RINGATTN_ERR_INVALID_USAGE,
                        FN ": comm: got %p, expected NULL or a live communicator", (void *)comm);
    }
    /* In a ring every rank reaches the agreement below, even with bad arguments: a rank that
       returned early would leave the others waiting. */
    ringattn_plan_desc_t d;
    const struct ra_backend *be = NULL;
    ringattn_status_t st = plan != NULL ? ra__desc_check(comm, desc, &d, &be)
                                        : ra__fail(RINGATTN_ERR_INVALID_ARGUMENT,
                                                   FN ": plan: got NULL, expected a pointer to "
                                                      "receive the plan");
    if (comm) st = ra__plan_agree(comm, &d, be, st);
    RA_TRY(st);

    struct ringattn_plan *p = calloc(1, sizeof *p);
    st = p ? RINGATTN_SUCCESS : ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    if (p) p->host_bytes = sizeof *p;
    if (st == RINGATTN_SUCCESS) st = plan_fill(p, comm, &d, be, kinds);
    if (st == RINGATTN_SUCCESS && ra__registry_add(p) != 0)
        st = ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    /* A collective creation ends the same on every rank: one whose memory ran out after the
       agreement fails it everywhere, and every rank frees its plan. */
    if (comm) st = ra__comm_conclude(comm, FN, st);
    if (st != RINGATTN_SUCCESS) {
        if (p) {
            ra__registry_remove(p);
            plan_free(p);
        }
        return st;
    }
    *plan = p;
    ra__plan_log(p);
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__plan_destroy(ringattn_plan_t plan)
{
    if (plan == NULL) return RINGATTN_SUCCESS;
    RA_CHECK(ra__registry_remove(plan), RINGATTN_ERR_INVALID_USAGE,
             "ringattn_plan_destroy: plan: got %p, expected a live plan (destroyed twice?)",
             (void *)plan);
    if (plan->grid)
        ra__grid_destroy(plan);
    else
        plan_free(plan);
    ra__clear_error();
    return RINGATTN_SUCCESS;
}
