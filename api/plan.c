/* ringattn_plan_create, _destroy and _get_info (ringattn.h): the plan floor's work (plan/plan.c,
   plan/info.c) behind the public names, with a failed creation's message as its log line. */
#include "api/kinds.h"
#include "base/abi.h"
#include "base/error.h"
#include "base/log.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "plan/grid.h"
#include "plan/info.h"
#include "plan/plan.h"

static ringattn_status_t logged(ringattn_comm_t comm, ringattn_status_t st)
{
    if (st != RINGATTN_SUCCESS) { /* the log line of a failure is its message */
        const int live = comm && ra__registry_contains(comm);
        ra__log_failure(RA_SUB_PLAN, live ? comm->rank : -1, live ? comm->size : 0, st);
    }
    return st;
}

ringattn_status_t ringattn_plan_create(ringattn_comm_t comm, const ringattn_plan_desc_t *desc,
                                       ringattn_plan_t *plan)
{
    static const char fn[] = "ringattn_plan_create";
    /* a 2D plan over one comm (plan/grid.h); the descriptor read by its release's size */
    ringattn_plan_desc_t d;
    if (comm && ra__registry_contains(comm) && desc && ra__desc_in(fn, desc, &d) == RINGATTN_SUCCESS &&
        d.ulysses_size > 1)
        return logged(comm, ra__grid_create(fn, comm, NULL, NULL, &d, &ra__plan_kinds, plan));
    return logged(comm, ra__plan_create(comm, desc, &ra__plan_kinds, plan));
}

ringattn_status_t ringattn_plan_create_2d(ringattn_comm_t group_comm, ringattn_comm_t ring_comm,
                                          const ringattn_plan_desc_t *desc, ringattn_plan_t *plan)
{
    static const char fn[] = "ringattn_plan_create_2d";
    if (!ra__registry_contains(group_comm) || !ra__registry_contains(ring_comm)) {
        ra__comm_refused(); /* no comm to agree over: the next agreement carries it */
        return logged(NULL, ra__fail(group_comm && ring_comm ? RINGATTN_ERR_INVALID_USAGE
                                                             : RINGATTN_ERR_INVALID_ARGUMENT,
                                     "%s: group_comm/ring_comm: got %p/%p, expected two live "
                                     "communicators", fn, (void *)group_comm, (void *)ring_comm));
    }
    return logged(group_comm,
                  ra__grid_create(fn, NULL, group_comm, ring_comm, desc, &ra__plan_kinds, plan));
}

ringattn_status_t ringattn_plan_destroy(ringattn_plan_t plan) { return ra__plan_destroy(plan); }

ringattn_status_t ringattn_plan_get_info(ringattn_plan_t plan, ringattn_plan_info_t *info)
{
    static const char fn[] = "ringattn_plan_get_info";
    RA_TRY(ra__plan_check(fn, plan));
    RA_TRY(ra__info_check(fn, info));
    ringattn_plan_info_t full = RINGATTN_PLAN_INFO_INIT;
    if (plan->grid)
        ra__grid_info(plan, &full);
    else
        ra__plan_info_fill(plan, &full);
    ra__info_out(&full, info);
    ra__clear_error(); /* a success leaves no message behind, as every call (DESIGN: errors) */
    return RINGATTN_SUCCESS;
}
