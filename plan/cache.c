/* A KV cache plan's shards, live partials, buffers and traffic (see cache.h). */
#include <stdlib.h>

#include "base/error.h"
#include "base/log.h"
#include "plan/buffers.h"
#include "plan/cache.h"
#include "plan/layout.h"
#include "plan/schedule.h"

/* Queries: every token of cu_seqlens, on every rank. Keys: each rank's slots of the cache (by
   cache_bounds, or by the layout: SPEC 8 applied to the keys), then the new tokens'. */
ringattn_status_t ra__cache_shards(struct ringattn_plan *p)
{
    const int n = p->kp.num_seqs;
    RA_TRY(ra__shard_make(RINGATTN_LAYOUT_CONTIGUOUS, 1, 0, p->cu_q, n, &p->queries));
    for (int r = 0; r < p->ranks; ++r)
        RA_TRY(p->cache_bounds
                   ? ra__shard_make_bounds(p->cache_bounds, p->ranks, r, n, &p->shards[r])
                   : ra__shard_make(p->layout, p->ranks, r, p->cu_cache, n, &p->shards[r]));
    if (p->new_shard >= 0)
        RA_TRY(ra__shard_make_new(p->cu_cache, p->cu_new, n, &p->shards[p->new_shard]));
    p->kp.queries = &p->queries;
    return RINGATTN_SUCCESS;
}

size_t ra__cache_part_bytes(const struct ringattn_plan *p)
{
    return p->buf->part_floats * sizeof(float);
}

void ra__cache_traffic(const struct ringattn_plan *p, size_t fwd[2], size_t bwd[2])
{
    fwd[0] = fwd[1] = bwd[0] = bwd[1] = 0; /* forward only */
    const int prev = (p->rank - 1 + p->ranks) % p->ranks;
    for (int t = 0; t + 1 < p->ranks; ++t) {
        if (p->part_slot[ra__cache_held_part(p, p->rank, t)] >= 0) fwd[0] += ra__cache_part_bytes(p);
        if (p->part_slot[ra__cache_held_part(p, prev, t)] >= 0) fwd[1] += ra__cache_part_bytes(p);
    }
}

/* Which ranks' keys some query meets (SPEC 3, exact): their partials are the live ones. */
ringattn_status_t ra__cache_schedule(struct ringattn_plan *p)
{
    const int P = p->ranks;
    p->part_slot = malloc((size_t)P * sizeof *p->part_slot);
    p->step_compute = calloc((size_t)P, 1);
    p->last_hop = calloc((size_t)P, sizeof *p->last_hop);
    RA_CHECK(p->part_slot && p->step_compute && p->last_hop, RINGATTN_ERR_OUT_OF_MEMORY,
             "ringattn_plan_create: out of memory");
    const ra_shard *fresh = p->new_shard >= 0 ? &p->shards[p->new_shard] : NULL;
    for (int r = 0; r < P; ++r) {
        const int cached = ra__shards_meet(p, &p->queries, &p->shards[r]);
        const int fresh_here = fresh && r == P - 1 && ra__shards_meet(p, &p->queries, fresh);
        if (r == p->rank) p->cache_meets = (unsigned char)cached, p->new_meets = (unsigned char)fresh_here;
        p->part_slot[r] = cached || fresh_here ? p->live_parts++ : -1;
    }
    p->num_steps = P; /* the local step, then the gather's P - 1 hops */
    p->step_compute[0] = p->cache_meets || p->new_meets;
    return RINGATTN_SUCCESS;
}

static void log_cache(const struct ringattn_plan *p)
{
    if (!ra__log_enabled(RA_LOG_INFO, RA_SUB_PLAN)) return;
    size_t fwd[2], bwd[2];
    ra__cache_traffic(p, fwd, bwd);
    ra__log(RA_LOG_INFO, RA_SUB_PLAN, p->rank, p->ranks,
            "KV cache: %lld queries on every rank, %lld cached keys here%s; %d of %d ranks' "
            "keys meet a query (the others compute and send nothing); partials of %zu bytes, "
            "sent/received %zu/%zu bytes per call",
            (long long)p->queries.rows, (long long)ra__local_keys(p)->rows,
            p->new_meets ? " and the new tokens'" : "", p->live_parts, p->ranks,
            ra__cache_part_bytes(p), fwd[0], fwd[1]);
}

static ringattn_status_t make_all(struct ringattn_plan *p, ra_buffers *b)
{
    const ra_kernel_params *k = &p->kp;
    const size_t H = (size_t)k->num_heads, rows = (size_t)p->queries.rows, Hb = (size_t)k->bias_heads;
    const size_t keys = (size_t)ra__local_keys(p)->rows, total = (size_t)p->cu_cache[k->num_seqs];
    const size_t fresh = p->new_shard >= 0 ? (size_t)p->shards[p->new_shard].rows : 0;
    const size_t slots = p->live_parts > 0 ? (size_t)p->live_parts : 1;
    b->part_floats = rows * H * (size_t)k->head_dim_v + H * rows;
    RA_TRY(ra__buffer_backend(p, b, H * rows * sizeof(float), (void **)&b->m));
    RA_TRY(ra__buffer_backend(p, b, H * rows * sizeof(float), (void **)&b->l));
    RA_TRY(ra__buffer_backend(p, b, rows * H * k->head_dim_v * sizeof(float), (void **)&b->acc));
    RA_TRY(ra__buffer_backend(p, b, slots * b->part_floats * sizeof(float), (void **)&b->parts));
    const size_t q_bytes = rows * H * (size_t)k->head_dim * ra__dtype_size(k->dtype);
    if (p->ranks > 1) { /* the call's agreement hashes Q: packed, on the host */
        RA_TRY(ra__buffer_backend(p, b, q_bytes, &b->q_packed));
        if (ra__memory_on_device(p->be->memory)) RA_TRY(ra__buffer_host(b, q_bytes, (void **)&b->host_q));
    }
    const size_t thr = k->selects ? Hb * rows : 0;
    RA_TRY(ra__buffer_backend(p, b, thr * sizeof(float), (void **)&b->thr_b));
    RA_TRY(ra__buffer_backend(p, b, thr * sizeof(int64_t), (void **)&b->thr_p));
    /* the last rank's bias, then the new tokens': what it contributes to the gather */
    const int last = p->rank == p->ranks - 1;
    RA_TRY(ra__buffer_host(b, Hb * (keys + (last ? fresh : 0)) * sizeof(float),
                           (void **)&b->host_own_bias));
    b->host_new_bias = last && fresh && Hb ? b->host_own_bias + Hb * keys : NULL;
    RA_TRY(ra__buffer_host(b, p->ranks > 1 && k->selects ? Hb * (total + fresh) * sizeof(float) : 0,
                           (void **)&b->host_bias));
    RA_TRY(ra__buffer_host(b, k->selects ? Hb * (size_t)p->cu_k[k->num_seqs] * sizeof(float) : 0,
                           (void **)&b->host_global));
    return ra__buffers_bias_layout(p, b, 1, (int64_t)fresh);
}

ringattn_status_t ra__cache_buffers(struct ringattn_plan *p)
{
    ra_buffers *b = calloc(1, sizeof *b);
    RA_CHECK(b != NULL, RINGATTN_ERR_OUT_OF_MEMORY, "ringattn_plan_create: out of memory");
    p->buf = b;
    RA_TRY(make_all(p, b)); /* on failure the plan frees what was made */
    log_cache(p);
    return RINGATTN_SUCCESS;
}
