/* ringattn_plan_create, _destroy and _get_info (ringattn.h): the plan floor's work (plan/plan.c,
   plan/info.c) behind the public names, with a failed creation's message as its log line. */
#include "api/kinds.h"
#include "base/abi.h"
#include "base/error.h"
#include "base/log.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "plan/info.h"
#include "plan/plan.h"

ringattn_status_t ringattn_plan_create(ringattn_comm_t comm, const ringattn_plan_desc_t *desc,
                                       ringattn_plan_t *plan)
{
    const ringattn_status_t st = ra__plan_create(comm, desc, &ra__plan_kinds, plan);
    if (st != RINGATTN_SUCCESS) { /* the log line of a failure is its message */
        const int live = comm && ra__registry_contains(comm);
        ra__log_failure(RA_SUB_PLAN, live ? comm->rank : -1, live ? comm->size : 0, st);
    }
    return st;
}

ringattn_status_t ringattn_plan_destroy(ringattn_plan_t plan) { return ra__plan_destroy(plan); }

ringattn_status_t ringattn_plan_get_info(ringattn_plan_t plan, ringattn_plan_info_t *info)
{
    static const char fn[] = "ringattn_plan_get_info";
    RA_TRY(ra__plan_check(fn, plan));
    RA_TRY(ra__info_check(fn, info));
    ringattn_plan_info_t full = RINGATTN_PLAN_INFO_INIT;
    ra__plan_info_fill(plan, &full);
    ra__info_out(&full, info);
    ra__clear_error(); /* a success leaves no message behind, as every call (DESIGN: errors) */
    return RINGATTN_SUCCESS;
}
