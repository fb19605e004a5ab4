/* The ring schedule (DESIGN: plan and schedule). Internal. */
#ifndef RINGATTN_RING_PLAN_SCHEDULE_H
#define RINGATTN_RING_PLAN_SCHEDULE_H

#include "ring/plan/plan.h"

/*
 * At step t rank r attends its queries to the keys of rank (r - t) mod P. Classifies every
 * (rank, shard) pair exactly (masks/) and marks the steps where this rank has work. Shard s
 * travels only as far as the farthest rank that needs it (last_hop[s] hops): no rank receives a
 * shard that neither it nor a rank after it needs, and the ring ends after the longest journey.
 * Logs the schedule at RINGATTN_LOG=info.
 */
ringattn_status_t ra__schedule_make(struct ringattn_plan *p);

/* The shard rank r holds at step t, and whether it still travels on after that step. */
static inline int ra__held_shard(const struct ringattn_plan *p, int r, int t)
{
    return ((r - t) % p->ranks + p->ranks) % p->ranks;
}
static inline int ra__moves_on(const struct ringattn_plan *p, int r, int t)
{
    return t < p->last_hop[ra__held_shard(p, r, t)];
}

/* Bytes of shard r's K, V (plan dtype) and bias, and of its float32 dK, dV and dBias. */
size_t ra__shard_kv_bytes(const struct ringattn_plan *p, int r);
size_t ra__shard_grad_bytes(const struct ringattn_plan *p, int r);

#endif
