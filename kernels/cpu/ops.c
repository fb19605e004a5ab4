/* The CPU backend's entry in the kernel table (DESIGN: two small tables). */
#include "kernels/cpu/cpu.h"

static ringattn_status_t cpu_supports(const struct ringattn_plan *p)
{
    (void)p; /* every shape, dtype and mask the plan accepts */
    ra__cpu_blas_check();
    return RINGATTN_SUCCESS;
}

const struct ra_kernel_ops ra__cpu_kernel_ops = {
    .name = "cpu",
    .supports = cpu_supports,
    .attend_forward = ra__cpu_attend_forward,
    .attend_backward = ra__cpu_attend_backward,
    .workspace_free = ra__cpu_workspace_free,
};
