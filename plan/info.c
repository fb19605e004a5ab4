/* What a plan will do and holds (ringattn_plan_get_info, api/plan.c) and its log lines at
   creation. */
#include "base/error.h"
#include "base/log.h"
#include "base/version.h"
#include "kernels/backends.h"
#include "plan/buffers.h"
#include "plan/info.h"

void ra__plan_info_fill(const struct ringattn_plan *p, ringattn_plan_info_t *info)
{
    size_t fwd[2], bwd[2];
    p->kind->traffic(p, fwd, bwd);
    info->rank = p->rank;
    info->ranks = p->ranks;
    info->local_tokens = p->kp.queries->rows;
    info->num_steps = p->num_steps;
    info->compute_steps = 0;
    for (int t = 0; t < p->num_steps; ++t) info->compute_steps += p->step_compute[t];
    info->forward_bytes_sent = fwd[0];
    info->forward_bytes_received = fwd[1];
    info->backward_bytes_sent = bwd[0];
    info->backward_bytes_received = bwd[1];
    info->backend = p->be->kind;
    info->device = p->be->kind == RINGATTN_BACKEND_CPU ? -1 : p->device;
    info->block_q = p->kp.block_q;
    info->block_k = p->kp.block_k;
    /* the other ranks' bias: a ring's always, a cache's for a selection only */
    const int64_t others = p->cu_cache[p->kp.num_seqs] - ra__local_keys(p)->rows;
    const int gathered = p->ranks > 1 && (!p->kind->same_queries || p->kp.selects);
    info->bias_bytes_received = gathered ? (size_t)others * p->kp.bias_heads * sizeof(float) : 0;
    info->workspace_bytes = p->ws_bytes;
    info->buffer_bytes = p->buf->bytes;
    info->host_bytes = p->host_bytes + p->buf->host_bytes;
    info->memory_bytes = info->workspace_bytes + info->buffer_bytes + info->host_bytes;
    info->ulysses_size = 1; /* a flat plan (a 2D one: plan/grid.c) */
    info->ring_size = p->ranks;
}

void ra__plan_log(const struct ringattn_plan *p)
{
    if (!ra__log_enabled(RA_LOG_INFO, RA_SUB_PLAN)) return;
    static const char *dtypes[] = {"float32", "float16", "bfloat16"};
    static const char *layouts[] = {"contiguous", "zigzag", "striped"};
    const ra_kernel_params *k = &p->kp;
    ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
    ra__plan_info_fill(p, &info);
    ra__log(RA_LOG_INFO, RA_SUB_PLAN, p->rank, p->ranks, "ringattn %s, backend %s, %d rank(s), layout %s; cpu kernels: %s",
            RA_VERSION_STRING, p->be->name, p->ranks, layouts[p->layout], ra__cpu_kernels());
    ra__log(RA_LOG_INFO, RA_SUB_PLAN, p->rank, p->ranks,
            "plan: %d seqs, %lld queries, %lld keys, heads %d/%d, dims %d/%d, %s (precision "
            "%s), window (%lld, %lld), scale %g, softcap %g, alibi %s",
            k->num_seqs, (long long)k->queries->rows, (long long)ra__local_keys(p)->rows,
            k->num_heads, k->num_kv_heads, k->head_dim, k->head_dim_v, dtypes[k->dtype],
            k->high_precision ? "high" : "default", (long long)k->window.left,
            (long long)k->window.right, (double)k->scale, (double)k->softcap,
            k->alibi ? "on" : "off");
    ra__log(RA_LOG_INFO, RA_SUB_PLAN, p->rank, p->ranks,
            "tiles %d x %d, threads %d (0: OpenMP's default); memory %zu bytes: workspace %zu, "
            "ring buffers %zu, host %zu",
            k->block_q, k->block_k, k->num_threads, info.memory_bytes, info.workspace_bytes,
            info.buffer_bytes, info.host_bytes);
}
