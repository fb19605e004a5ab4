/* What a plan will do and holds: ringattn_plan_get_info's fields and the plan's log lines.
   Internal. */
#ifndef RINGATTN_PLAN_INFO_H
#define RINGATTN_PLAN_INFO_H

#include "plan/plan.h"

/* Every field of this version's info struct. */
void ra__plan_info_fill(const struct ringattn_plan *p, ringattn_plan_info_t *info);
/* RINGATTN_LOG=info: version, backend, layout, shapes, masks, tiles and memory of a new plan. */
void ra__plan_log(const struct ringattn_plan *p);

#endif
