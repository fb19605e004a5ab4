/* Descriptor validation and backend choice for ringattn_plan_create. Internal. */
#ifndef RINGATTN_PLAN_CHECK_H
#define RINGATTN_PLAN_CHECK_H

#include "kernels/backend.h"
#include "ringattn.h"

/*
 * Everything a rank can check alone about the caller's descriptor: on success *desc is this
 * version's descriptor (missing fields at their defaults, ringattn.h's struct_size policy) and
 * *backend the backend it runs on.
 */
ringattn_status_t ra__desc_check(ringattn_comm_t comm, const ringattn_plan_desc_t *caller,
                                 ringattn_plan_desc_t *desc, const struct ra_backend **backend);

#endif
