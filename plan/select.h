/* SPEC 6 global top-k selection for a plan's local queries. Internal. */
#ifndef RINGATTN_PLAN_SELECT_H
#define RINGATTN_PLAN_SELECT_H

#include "plan/plan.h"

/* Per (bias head, local query row) thresholds, [bias_heads, q rows] each (masks/topk.h), in
   host memory. */
typedef struct ra_thresholds {
    const float *b;
    const int64_t *p;
    const float *lowest; /* [bias_heads]: the lowest b over the local rows */
} ra_thresholds;

/* The selection's buffers, at plan creation (none without a selection). */
ringattn_status_t ra__select_make(struct ringattn_plan *p);

/*
 * The thresholds of every local query row over the keys of its whole sequence. global_bias is
 * the bias of every key of the batch, [bias_heads, T_k] in host memory (in a ring, gathered
 * from all ranks). Without a selection (kp.selects == 0) every pointer is NULL.
 */
ringattn_status_t ra__select_thresholds(struct ringattn_plan *p, const float *global_bias,
                                        ra_thresholds *out);
void ra__select_free(struct ra_select *s);

#endif
