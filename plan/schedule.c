/* The ring schedule: which steps compute, how far the KV travels (see schedule.h). */
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/log.h"
#include "plan/buffers.h"
#include "plan/layout.h"
#include "plan/schedule.h"

size_t ra__shard_kv_bytes(const struct ringattn_plan *p, int r)
{
    return ra__packed_kv_bytes(p, p->shards[r].rows);
}

size_t ra__shard_grad_bytes(const struct ringattn_plan *p, int r)
{
    return ra__packed_sums_bytes(p, p->shards[r].rows);
}

int ra__shards_meet(const struct ringattn_plan *p, const ra_shard *a, const ra_shard *b)
{
    for (int i = 0; i < a->num_segs; ++i) {
        const ra_span *q = &a->segs[i].span;
        for (int32_t j = b->seq_first[q->seq]; j < b->seq_first[q->seq + 1]; ++j)
            if (ra__classify_block(p->kp.window, p->delta[q->seq], q, &b->segs[j].span, NULL,
                                   NULL) != RA_BLOCK_EMPTY)
                return 1;
    }
    return 0;
}

/* Bytes this rank sends and receives in one forward and one backward (ring.c's exchanges). */
void ra__schedule_traffic(const struct ringattn_plan *p, size_t fwd[2], size_t bwd[2])
{
    const int r = p->rank, prev = (r - 1 + p->ranks) % p->ranks;
    fwd[0] = fwd[1] = bwd[0] = bwd[1] = 0;
    for (int t = 0; t + 1 < p->num_steps; ++t) {
        const int held = ra__held_shard(p, r, t), next = ra__held_shard(p, prev, t);
        /* dK/dV sums travel from the first hop on: the owner keeps its own part at home */
        if (ra__moves_on(p, r, t)) {
            fwd[0] += ra__shard_kv_bytes(p, held);
            bwd[0] += ra__shard_kv_bytes(p, held) + (t > 0 ? ra__shard_grad_bytes(p, held) : 0);
        }
        if (ra__moves_on(p, prev, t)) {
            fwd[1] += ra__shard_kv_bytes(p, next);
            bwd[1] += ra__shard_kv_bytes(p, next) + (t > 0 ? ra__shard_grad_bytes(p, next) : 0);
        }
    }
    for (int t = 1; t < p->num_steps; ++t) { /* finished dK/dV sums go straight to the owner */
        const int held = ra__held_shard(p, r, t);
        if (p->last_hop[held] == t) bwd[0] += ra__shard_grad_bytes(p, held);
    }
    if (p->last_hop[r] > 0) bwd[1] += ra__shard_grad_bytes(p, r);
}

static void log_schedule(const struct ringattn_plan *p)
{
    if (!ra__log_enabled(RA_LOG_INFO, RA_SUB_PLAN) || p->ranks == 1) return;
    char steps[256];
    int kept = 0, len = 0;
    for (int t = 0; t < p->num_steps; ++t) {
        kept += p->step_compute[t];
        if (len < (int)sizeof steps - 8)
            len += snprintf(steps + len, sizeof steps - (size_t)len, "%s%c", t ? " " : "",
                            p->step_compute[t] ? 'C' : '-');
    }
    size_t fwd[2], bwd[2];
    ra__schedule_traffic(p, fwd, bwd);
    ra__log(RA_LOG_INFO, RA_SUB_PLAN, p->rank, p->ranks,
            "schedule: %d of %d ring steps [%s] (C = compute, - = EMPTY, skipped), %d computed; "
            "bytes sent/received: forward %zu/%zu, backward %zu/%zu",
            p->num_steps, p->ranks, steps, kept, fwd[0], fwd[1], bwd[0], bwd[1]);
}

ringattn_status_t ra__ring_shards(struct ringattn_plan *p)
{
    const int n = p->kp.num_seqs;
    if (!p->comm) {
        RA_TRY(ra__shard_make(RINGATTN_LAYOUT_CONTIGUOUS, 1, 0, p->cu_q, n, &p->queries));
        RA_TRY(ra__shard_make(RINGATTN_LAYOUT_CONTIGUOUS, 1, 0, p->cu_cache, n, &p->shards[0]));
        p->kp.queries = &p->queries;
        return RINGATTN_SUCCESS;
    }
    for (int r = 0; r < p->ranks; ++r)
        RA_TRY(ra__shard_make(p->layout, p->ranks, r, p->cu_q, n, &p->shards[r]));
    p->kp.queries = &p->shards[p->rank];
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__schedule_make(struct ringattn_plan *p)
{
    const int P = p->ranks;
    p->step_compute = calloc((size_t)P, 1);
    p->last_hop = calloc((size_t)P, sizeof *p->last_hop);
    RA_CHECK(p->step_compute && p->last_hop, RINGATTN_ERR_OUT_OF_MEMORY,
             "ringattn_plan_create: out of memory");
    p->step_compute[0] = 1; /* always: the step that initialises and finalises the state */
    p->num_steps = 1;
    for (int s = 0; P > 1 && s < P; ++s) {
        for (int j = 1; j < P; ++j) { /* rank s + j meets shard s at step j */
            const int r = (s + j) % P;
            if (!ra__shards_meet(p, &p->shards[r], &p->shards[s])) continue;
            p->last_hop[s] = j;
            if (r == p->rank) p->step_compute[j] = 1;
        }
        if (p->last_hop[s] + 1 > p->num_steps) p->num_steps = p->last_hop[s] + 1;
    }
    log_schedule(p);
    return RINGATTN_SUCCESS;
}
