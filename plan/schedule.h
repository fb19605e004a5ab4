/* The ring schedule (DESIGN: the ring). Internal. */
#ifndef RINGATTN_PLAN_SCHEDULE_H
#define RINGATTN_PLAN_SCHEDULE_H

#include "plan/plan.h"

/*
 * At step t rank r attends its queries to the keys of rank (r - t) mod P. Classifies every
 * (rank, shard) pair exactly (masks/) and marks the steps where this rank has work. Shard s
 * travels only as far as the farthest rank that needs it (last_hop[s] hops): no rank receives a
 * shard that neither it nor a rank after it needs, and the ring ends after the longest journey.
 * Logs the schedule at RINGATTN_LOG=info.
 */
ringattn_status_t ra__schedule_make(struct ringattn_plan *p);

/* A ring's shards (SPEC 8): every rank's under the plan's layout, the local queries this rank's;
   without a comm, one contiguous shard of every key and the queries of cu_seqlens_q. */
ringattn_status_t ra__ring_shards(struct ringattn_plan *p);

/* Does any query of shard a see any key of shard b? Exact (SPEC 3 over every segment pair). */
int ra__shards_meet(const struct ringattn_plan *p, const ra_shard *a, const ra_shard *b);

/* The shard rank r holds at step t, and whether it still travels on after that step. */
static inline int ra__held_shard(const struct ringattn_plan *p, int r, int t)
{
    return ((r - t) % p->ranks + p->ranks) % p->ranks;
}
static inline int ra__moves_on(const struct ringattn_plan *p, int r, int t)
{
    return t < p->last_hop[ra__held_shard(p, r, t)];
}

/* Bytes of shard r packed (plan/buffers.h): its K, V (plan dtype), and its float32 sums. */
size_t ra__shard_kv_bytes(const struct ringattn_plan *p, int r);
size_t ra__shard_grad_bytes(const struct ringattn_plan *p, int r);

/* Bytes this rank sends ([0]) and receives ([1]) on the data plane in one forward and one
   backward call. */
void ra__schedule_traffic(const struct ringattn_plan *p, size_t fwd[2], size_t bwd[2]);

#endif
