/*
 * The packed shard that travels the ring, and the ring driver's buffers, made once at plan
 * creation through the backend (its memory: device memory on a GPU). Internal.
 *
 * A packed shard of `rows` tokens: K [rows, H_kv, D] then V [rows, H_kv, D_v], plan dtype.
 * Its sums (backward): dK [rows, H_kv, D], dV [rows, H_kv, D_v], dBias [H_b, rows], float32.
 * The key bias does not travel: it is gathered once per call on the control plane.
 */
#ifndef RINGATTN_PLAN_BUFFERS_H
#define RINGATTN_PLAN_BUFFERS_H

#include <stddef.h>
#include <stdint.h>

#include "base/view.h"

struct ringattn_plan;

size_t ra__packed_kv_bytes(const struct ringattn_plan *p, int64_t rows);
size_t ra__packed_sums_bytes(const struct ringattn_plan *p, int64_t rows);
void ra__packed_kv_views(const struct ringattn_plan *p, void *buf, int64_t rows, ra_view *k,
                         ra_view *v);
/* dK, dV views and the dBias rows ([H_b, rows]) of packed sums. */
void ra__packed_sums_views(const struct ringattn_plan *p, void *buf, int64_t rows, ra_view *dk,
                           ra_view *dv, float **dbias);

typedef struct ra_buffers {
    /* backend memory */
    void *kv[2];        /* packed K, V: the held shard and the next (ring) */
    void *sums[2];      /* packed sums of the shard at hand and of the next (ring backward) */
    void *own_part;     /* this rank's part of its own shard's sums, which never travels */
    void *returned;     /* the other ranks' sums of this rank's shard, back from its last hop */
    float *m, *l;       /* [H, rows] forward state; backward: recomputed row stats (SPEC 9) */
    float *acc;         /* [rows, H, max(D, D_v)]: forward acc, backward dQ sums (ring) */
    float *bias;        /* [H_b, T] every shard's bias, shard after shard (ring with a bias) */
    float *thr_b;       /* [H_b, rows] SPEC 6 thresholds, the kernels' copy (a selection) */
    int64_t *thr_p;
    /* host memory */
    float *host_own_bias; /* [H_b, local keys] this rank's bias: checks, the gather's input */
    float *host_bias;     /* [H_b, T] every shard's bias, shard after shard (ring) */
    float *host_global;   /* [H_b, T] in global token order: the selection's input (ring) */
    int64_t *bias_at;     /* [ranks + 1] where each shard's bias starts in bias, host_bias */
    size_t *bias_bytes;   /* [ranks] bytes of each shard's bias (the gather's sizes) */
    unsigned char *run;   /* [num_steps] this call's decisions: does step t compute */
    /* a KV cache plan's (plan/cache.c) */
    float *parts;         /* backend: [live_parts] float32 partials of part_floats each */
    size_t part_floats;   /* O [query rows, H, D_v] then LSE [H, query rows] */
    void *q_packed;       /* backend: this call's Q packed, hashed in the call's agreement */
    unsigned char *host_q; /* its host copy (device backends) */
    float *host_new_bias; /* the last rank's: [H_b, new keys] the new tokens' bias (checks, the
                             selection), after its own in host_own_bias (one gather) */
    size_t bytes;         /* backend memory held */
    size_t host_bytes;    /* host memory held */
} ra_buffers;

ringattn_status_t ra__buffers_make(struct ringattn_plan *p);
/* One buffer of `bytes` in the backend's memory or the host's (none when 0), counted in b. */
ringattn_status_t ra__buffer_backend(const struct ringattn_plan *p, ra_buffers *b, size_t bytes,
                                     void **out);
ringattn_status_t ra__buffer_host(ra_buffers *b, size_t bytes, void **out);
/* bias_at, bias_bytes: where each rank's bias sits in the gather of every rank's (rank after
   rank: its keys' rows, the last rank's and last_extra more; none where not gathered). */
ringattn_status_t ra__buffers_bias_layout(const struct ringattn_plan *p, ra_buffers *b,
                                          int gathered, int64_t last_extra);
void ra__buffers_free(struct ringattn_plan *p);

#endif
