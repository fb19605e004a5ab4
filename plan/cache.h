/*
 * Plans of inference against a KV cache (ringattn.h: sharded_cache, cu_seqlens_new): their
 * shards, which ranks' partials can be non-empty, their buffers and traffic. The call's driver
 * is ring/cache.c. Internal.
 *
 * Every rank holds every query and its own slots of the cache (shards[rank]); the last rank
 * also attends the new tokens' K/V (shards[ranks]). Each rank's keys give a partial (O, LSE)
 * of every query (SPEC 5: attention over disjoint key sets), and the partials travel the ring
 * once, P - 1 hops, so that every rank merges all of them in rank order: the same bits on every
 * rank. A rank whose keys no query meets (SPEC 3: a window that ends before its slots) has an
 * empty partial, computes nothing and sends nothing.
 */
#ifndef RINGATTN_PLAN_CACHE_H
#define RINGATTN_PLAN_CACHE_H

#include <stddef.h>

#include "plan/plan.h"

ringattn_status_t ra__cache_shards(struct ringattn_plan *p);
ringattn_status_t ra__cache_schedule(struct ringattn_plan *p);
ringattn_status_t ra__cache_buffers(struct ringattn_plan *p);

/* The partial rank r passes on at hop t (0 .. ranks - 2) of the gather: rank (r - t) mod P's. */
static inline int ra__cache_held_part(const struct ringattn_plan *p, int r, int t)
{
    return ((r - t) % p->ranks + p->ranks) % p->ranks;
}

/* Bytes of one partial, and this rank's sent ([0]) and received ([1]) bytes in one call. */
size_t ra__cache_part_bytes(const struct ringattn_plan *p);
void ra__cache_traffic(const struct ringattn_plan *p, size_t fwd[2], size_t bwd[2]);

#endif
