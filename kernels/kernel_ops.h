/* The backend table of DESIGN "two small tables": one per backend (cpu/, later cuda/). */
#ifndef RINGATTN_KERNELS_KERNEL_OPS_H
#define RINGATTN_KERNELS_KERNEL_OPS_H

#include "ring/tensor.h"
#include "ringattn.h"

struct ringattn_plan;
struct ra_workspace;

struct ra_kernel_ops {
    const char *name;
    /* Can this backend run the plan? (message + RINGATTN_ERR_UNSUPPORTED if not) */
    ringattn_status_t (*supports)(const struct ringattn_plan *plan);
    /* O and LSE of the local queries against all keys (validated tensors). */
    ringattn_status_t (*forward)(struct ringattn_plan *plan, const ra_args *a);
    /* dQ, dK, dV (SPEC 7). */
    ringattn_status_t (*backward)(struct ringattn_plan *plan, const ra_args *a);
    void (*workspace_free)(struct ra_workspace *ws);
};

extern const struct ra_kernel_ops ra__cpu_kernel_ops;

#endif
