/* The ring schedule (DESIGN: plan and schedule). Internal. */
#ifndef RINGATTN_RING_SCHEDULE_H
#define RINGATTN_RING_SCHEDULE_H

#include "ring/plan.h"

/*
 * At step t rank r attends its queries to the keys of rank (r - t) mod P. Classifies every
 * (rank, shard) pair exactly (masks/), marks the steps where this rank has work and cuts the
 * ring after the last step any rank needs. Logs the schedule at RINGATTN_LOG=info.
 */
ringattn_status_t ra__schedule_make(struct ringattn_plan *p);

/* Bytes of shard r's K and V in the plan's dtype, and of its float32 dK and dV. */
size_t ra__shard_kv_bytes(const struct ringattn_plan *p, int r);
size_t ra__shard_grad_bytes(const struct ringattn_plan *p, int r);

#endif
