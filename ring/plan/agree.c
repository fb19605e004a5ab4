/*
 * DESIGN, the ring: creating a plan checks that every rank passed the same descriptor. Each rank hashes
 * its descriptor; one allreduce (MIN over {ok, hash, -hash}) tells every rank whether all were
 * valid and all hashes equal, so a mismatch is an error on every rank, never a hang. (Each
 * forward and backward call agrees the same way: ring/call.c.)
 */
#include <string.h>

#include "base/error.h"
#include "comm/comm.h"
#include "ring/plan/agree.h"

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

#define MIX(h, x) ((h) = fnv((h), &(x), sizeof(x)))

/* Every field that changes the result or the schedule (not num_threads or device: per-rank
   choices), and the backend the descriptor resolved to. */
static int64_t desc_hash(const ringattn_plan_desc_t *d, ringattn_backend_t backend)
{
    uint64_t h = 0xcbf29ce484222325ull;
    MIX(h, d->num_heads);
    MIX(h, d->num_kv_heads);
    MIX(h, d->head_dim);
    MIX(h, d->head_dim_v);
    MIX(h, d->dtype);
    MIX(h, d->layout);
    MIX(h, d->num_seqs);
    if (d->cu_seqlens) h = fnv(h, d->cu_seqlens, ((size_t)d->num_seqs + 1) * sizeof(int32_t));
    const int has_k = d->cu_seqlens_k != NULL, has_alibi = d->alibi_slopes != NULL;
    MIX(h, has_k);
    MIX(h, d->causal);
    MIX(h, d->window_left);
    MIX(h, d->window_right);
    MIX(h, d->softmax_scale);
    MIX(h, d->softcap);
    MIX(h, has_alibi);
    if (has_alibi) h = fnv(h, d->alibi_slopes, (size_t)d->num_heads * sizeof(float));
    MIX(h, d->key_bias_heads);
    MIX(h, d->keep_k);
    MIX(h, d->block_q);
    MIX(h, d->block_k);
    MIX(h, backend);
    return (int64_t)(h >> 1); /* non-negative, so that -hash cannot overflow */
}

ringattn_status_t ra__plan_agree(ringattn_comm_t comm, const ringattn_plan_desc_t *desc,
                                 const struct ra_backend *backend, ringattn_status_t local)
{
    const int ok = local == RINGATTN_SUCCESS;
    const int64_t h = ok ? desc_hash(desc, backend->kind) : 0;
    int64_t vals[3] = {ok, h, -h};
    RA_TRY(comm->ops->allreduce_i64(comm, vals, 3, RA_REDUCE_MIN));
    if (!ok) return local; /* this rank's own message stands */
    RA_CHECK(vals[0] == 1, RINGATTN_ERR_INVALID_ARGUMENT,
             "ringattn_plan_create: desc: rejected on another rank, expected a valid descriptor "
             "on every rank (see that rank's message)");
    RA_CHECK(vals[1] == -vals[2], RINGATTN_ERR_INVALID_ARGUMENT,
             "ringattn_plan_create: desc: differs between ranks (rank %d of %d), expected the "
             "same descriptor on every rank",
             comm->rank, comm->size);
    return RINGATTN_SUCCESS;
}
