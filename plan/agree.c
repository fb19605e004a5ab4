/*
 * DESIGN, the ring: creating a plan checks that every rank passed the same descriptor. Each rank
 * hashes every field of its descriptor; the call's agreement (comm/comm.c: ra__comm_agree, MIN
 * over {hash, -hash} of each field) tells every rank whether all were valid and which field
 * differs, so a mismatch is an error on every rank, never a hang. (Each forward and backward
 * call agrees the same way: ring/call.c.)
 */
#include <string.h>

#include "base/error.h"
#include "comm/comm.h"
#include "plan/agree.h"

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *b = data;
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int64_t ra__hash_of(const void *data, size_t n)
{
    return (int64_t)(fnv(0xcbf29ce484222325ull, data, n) >> 1); /* -hash cannot overflow */
}

#define FIELD(name, expr) {name, ra__hash_of(&(expr), sizeof(expr))}

typedef struct field_hash {
    const char *name;
    int64_t hash;
} field_hash;

enum { NUM_FIELDS = 26 };

/* Every field that changes the result or the schedule (not num_threads or device: per-rank
   choices), and the backend the descriptor resolved to. */
static void desc_fields(const ringattn_plan_desc_t *d, ringattn_backend_t backend, int ranks,
                        field_hash f[NUM_FIELDS])
{
    const size_t n = (size_t)d->num_seqs + 1;
    const field_hash all[NUM_FIELDS] = {
        FIELD("num_heads", d->num_heads),
        FIELD("num_kv_heads", d->num_kv_heads),
        FIELD("head_dim", d->head_dim),
        FIELD("head_dim_v", d->head_dim_v),
        FIELD("dtype", d->dtype),
        FIELD("layout", d->layout),
        FIELD("num_seqs", d->num_seqs),
        {"cu_seqlens", d->cu_seqlens ? ra__hash_of(d->cu_seqlens, n * sizeof(int32_t)) : 0},
        {"cu_seqlens_k", d->cu_seqlens_k ? ra__hash_of(d->cu_seqlens_k, n * sizeof(int32_t)) : 0},
        FIELD("causal", d->causal),
        FIELD("window_left", d->window_left),
        FIELD("window_right", d->window_right),
        FIELD("softmax_scale", d->softmax_scale),
        FIELD("softcap", d->softcap),
        {"alibi_slopes",
         d->alibi_slopes ? ra__hash_of(d->alibi_slopes, (size_t)d->num_heads * sizeof(float)) : 0},
        FIELD("key_bias_heads", d->key_bias_heads),
        FIELD("keep_k", d->keep_k),
        FIELD("block_q", d->block_q),
        FIELD("block_k", d->block_k),
        FIELD("backend", backend),
        FIELD("sharded_cache", d->sharded_cache),
        {"cache_bounds", d->cache_bounds ? ra__hash_of(d->cache_bounds, (size_t)d->num_seqs *
                                                                      ((size_t)ranks + 1) *
                                                                      sizeof(int32_t))
                                         : 0},
        {"cu_seqlens_new",
         d->cu_seqlens_new ? ra__hash_of(d->cu_seqlens_new, n * sizeof(int32_t)) : 0},
        FIELD("precision", d->precision),
        FIELD("ulysses_size", d->ulysses_size),
        FIELD("ulysses_strided", d->ulysses_strided),
    };
    memcpy(f, all, sizeof all);
}

ringattn_status_t ra__plan_agree(ringattn_comm_t comm, const ringattn_plan_desc_t *desc,
                                 const struct ra_backend *backend, ringattn_status_t local)
{
    field_hash f[NUM_FIELDS];
    int64_t vals[2 * NUM_FIELDS];
    if (local == RINGATTN_SUCCESS) {
        desc_fields(desc, backend->kind, comm->size, f);
        for (int i = 0; i < NUM_FIELDS; ++i) {
            vals[2 * i] = f[i].hash;
            vals[2 * i + 1] = -f[i].hash;
        }
    }
    RA_TRY(ra__comm_agree(comm, "ringattn_plan_create", RA_CALL_PLAN_CREATE, 0, local, vals,
                          2 * NUM_FIELDS));
    for (int i = 0; i < NUM_FIELDS; ++i)
        RA_CHECK(vals[2 * i] == -vals[2 * i + 1], RINGATTN_ERR_INVALID_ARGUMENT,
                 "ringattn_plan_create: desc.%s: differs between ranks (this is rank %d of %d), "
                 "expected the same descriptor on every rank",
                 f[i].name, comm->rank, comm->size);
    return RINGATTN_SUCCESS;
}
