/* The ring schedule: which steps compute, how far the KV travels (see schedule.h). */
#include <stdlib.h>

#include "ring/error.h"
#include "ring/log.h"
#include "ring/schedule.h"
#include "ring/tensor.h"

static size_t shard_bytes(const struct ringattn_plan *p, int r, size_t elem)
{
    const int64_t rows = p->shards ? p->shards[r].rows : p->k_shard.rows;
    return (size_t)rows * p->num_kv_heads * (size_t)(p->head_dim + p->head_dim_v) * elem;
}

size_t ra__shard_kv_bytes(const struct ringattn_plan *p, int r)
{
    return shard_bytes(p, r, ra__dtype_size(p->dtype));
}

size_t ra__shard_grad_bytes(const struct ringattn_plan *p, int r)
{
    return shard_bytes(p, r, sizeof(float));
}

/* Does any query of shard a see any key of shard b? Exact (SPEC 3 over every segment pair). */
static int shards_meet(const struct ringattn_plan *p, const ra_shard *a, const ra_shard *b)
{
    for (int i = 0; i < a->num_segs; ++i) {
        const ra_span *q = &a->segs[i].span;
        for (int32_t j = b->seq_first[q->seq]; j < b->seq_first[q->seq + 1]; ++j)
            if (ra__classify_block(p->window, p->delta[q->seq], q, &b->segs[j].span, NULL, NULL) !=
                RA_BLOCK_EMPTY)
                return 1;
    }
    return 0;
}

static void log_schedule(const struct ringattn_plan *p)
{
    if (!ra__log_enabled(RA_LOG_INFO)) return;
    const int P = p->ranks, r = p->rank;
    int kept = 0;
    size_t sent = 0, received = 0;
    for (int t = 0; t < p->num_steps; ++t) {
        kept += p->step_compute[t];
        if (t + 1 < p->num_steps) {
            sent += ra__shard_kv_bytes(p, (r - t + P) % P);
            received += ra__shard_kv_bytes(p, (r - t - 1 + 2 * P) % P);
        }
    }
    ra__log(RA_LOG_INFO, r, P,
            "schedule: %d of %d ring steps, compute at %d (%d skipped as EMPTY), forward KV "
            "bytes sent %zu, received %zu",
            p->num_steps, P, kept, p->num_steps - kept, sent, received);
}

ringattn_status_t ra__schedule_make(struct ringattn_plan *p)
{
    const int P = p->ranks;
    p->step_compute = calloc((size_t)P, 1);
    RA_CHECK(p->step_compute, RINGATTN_ERR_OUT_OF_MEMORY, "ringattn_plan_create: out of memory");
    p->step_compute[0] = 1; /* always: the step that initialises and finalises the state */
    p->num_steps = 1;
    for (int r = 0; P > 1 && r < P; ++r) {
        for (int t = 1; t < P; ++t) {
            if (!shards_meet(p, &p->shards[r], &p->shards[(r - t + P) % P])) continue;
            if (t + 1 > p->num_steps) p->num_steps = t + 1;
            if (r == p->rank) p->step_compute[t] = 1;
        }
    }
    log_schedule(p);
    return RINGATTN_SUCCESS;
}
