/* The CPU backend's entry in the backend table (kernels/backend.h). */
#include "kernels/cpu/threads.h"

#include "kernels/cpu/cpu.h"

#define RA_CPU_DEFAULT_BLOCK 256 /* best of 64..512 at T = 8192, D = 128 (DESIGN: CPU kernels) */

/* Every shape, dtype and mask the plan accepts runs here; decide the tiles and threads. */
static ringattn_status_t cpu_prepare(ra_kernel_params *p)
{
    ra__cpu_blas_check();
    if (!p->block_q) p->block_q = RA_CPU_DEFAULT_BLOCK;
    if (!p->block_k) p->block_k = RA_CPU_DEFAULT_BLOCK;
    p->keys_block = p->block_k; /* the backward's key-sums tiles */
    return RINGATTN_SUCCESS;
}

static ringattn_status_t cpu_workspace_create(const ra_kernel_params *p, struct ra_workspace **ws,
                                              size_t *bytes)
{
    ra_kernel_params sized = *p; /* threads: the plan's, or OpenMP's default now */
    if (sized.num_threads <= 0) sized.num_threads = omp_get_max_threads();
    return ra__cpu_workspace_create(&sized, ws, bytes);
}

const struct ra_backend ra__cpu_backend = {
    .name = "cpu",
    .kind = RINGATTN_BACKEND_CPU,
    .prepare = cpu_prepare,
    .check_tensor = NULL, /* host memory of any alignment */
    .workspace_create = cpu_workspace_create,
    .workspace_destroy = ra__cpu_workspace_destroy,
    .backward_workspace = ra__cpu_backward_workspace,
    .memory = &ra__host_memory,
    .copy = ra__cpu_copy,
    .add_f32 = ra__cpu_add_f32,
    .scan = ra__cpu_scan,
    .merge = ra__cpu_merge,
    .state_partial = ra__cpu_state_partial,
    .merge_f32 = ra__cpu_merge_f32,
    .attend_forward = ra__cpu_attend_forward,
    .backward_prologue = ra__cpu_backward_prologue,
    .attend_backward = ra__cpu_attend_backward,
};
