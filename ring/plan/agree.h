/* Collective checks: every rank passed the same, valid descriptor; every rank's call arguments
   were valid. Internal. */
#ifndef RINGATTN_RING_PLAN_AGREE_H
#define RINGATTN_RING_PLAN_AGREE_H

#include "ringattn.h"
#include "ring/plan/plan.h"

/* Collective over comm. local: this rank's own validation result. */
ringattn_status_t ra__plan_agree(ringattn_comm_t comm, const ringattn_plan_desc_t *desc,
                                 ringattn_status_t local);

/*
 * Collective over the plan's ring (a no-op on one rank). local: this rank's own check of its
 * call arguments. A rank whose arguments were refused keeps its own message; the others fail
 * too, before any K/V moves, so that no rank waits for one that left the call, and a retried
 * call never meets messages of the failed one.
 */
ringattn_status_t ra__call_agree(const struct ringattn_plan *p, const char *fn,
                                 ringattn_status_t local);

#endif
