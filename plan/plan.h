/* The plan as built: what the kernels see, the descriptor's owned copies, the schedule and the
   buffers of the ring. Internal. */
#ifndef RINGATTN_PLAN_PLAN_H
#define RINGATTN_PLAN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "base/call_stream.h"
#include "kernels/backend.h"
#include "kernels/params.h"
#include "masks/shard.h"
#include "plan/kind.h"
#include "ringattn.h"

struct ringattn_plan {
    ra_kernel_params kp; /* shapes, masks, tiles, tokens: all a kernel sees (kernels/params.h) */
    /* owned copies of the descriptor's arrays, and derived values */
    int32_t *cu_q, *cu_k; /* [num_seqs + 1] the global batch's boundaries (SPEC 1): queries,
                             and every key (cached and new) */
    int32_t *cu_cache;    /* [num_seqs + 1] the keys of the caller's K, V (cu_seqlens_k) */
    int32_t *cu_new;      /* [num_seqs + 1] new tokens' K/V (cu_seqlens_new), or NULL */
    int32_t *cache_bounds; /* the descriptor's per-rank slot ranges, or NULL */
    int64_t *delta;       /* [num_seqs] kp.delta */
    float *alibi;         /* [num_heads] or NULL: kp.alibi */
    int keep_k;           /* SPEC 6, 0 = no selection */
    int32_t longest_k;    /* keys of the longest sequence */
    ringattn_layout_t layout;
    /* Tokens. shards: the key shards (kp.key_shards), one per rank in a ring (SPEC 8), or the
       keys of cu_seqlens_k on one rank; the local queries are shards[rank] in a ring and
       `queries` (of cu_seqlens) on one rank. */
    ra_shard *shards;
    int num_shards;
    ra_tile_list *tiles;  /* [num_shards] kp.key_tiles */
    ra_shard queries;
    const ra_plan_kind *kind; /* a ring or a KV cache plan (plan/kind.h) */
    /* Inference (ring/cache.c): a sharded cache, or new K/V. shards[ranks] is then the new
       tokens' keys (new_shard, else -1), attended on the last rank. part_slot[r]: where rank
       r's partial sits among the live_parts partials that can be non-empty, in rank order, or
       -1 when no query meets any key of rank r (its partial is empty and never sent). */
    int new_shard;
    int *part_slot;
    int live_parts;
    unsigned char cache_meets; /* some query meets this rank's cached keys */
    unsigned char new_meets;   /* ... the new keys (the last rank only) */
    /* the backend and what it holds for the plan */
    const struct ra_backend *be;
    int device;
    struct ra_workspace *ws;
    size_t ws_bytes;
    ra_call_stream stream; /* the CPU backend's: host transports attach to it */
    /* The ring: a single-rank plan has comm == NULL and ranks == 1. */
    ringattn_comm_t comm;
    int rank, ranks;
    unsigned id; /* the comm's number of the call that made the plan, in every call's agreement */
    int pinned;  /* a call failed with the transport still running over the buffers: destroy
                    frees them only once the comm says nothing runs (DESIGN, failure semantics) */
    int num_steps;               /* ring steps: 1 + the longest journey of any shard */
    unsigned char *step_compute; /* [ranks] does this rank compute at step t (EMPTY skipped) */
    int *last_hop;               /* [ranks] shard s travels s -> s+1 -> ... -> s+last_hop[s] */
    struct ra_buffers *buf;      /* the driver's buffers (plan/buffers.h) */
    struct ra_select *select;    /* SPEC 6 top-k thresholds and their scratch */
    size_t host_bytes;           /* host memory the plan holds besides buf and ws */
    /* A 2D plan (plan/grid.h): this struct is then a shell around the grid, whose inner plan
       does the work; of the fields above only be, device, rank, ranks, stream and host_bytes
       are set. */
    struct ra_grid *grid;
};

/* This rank's own keys: its shard in a ring or a sharded cache, every cached key on one rank. */
static inline const ra_shard *ra__local_keys(const struct ringattn_plan *p)
{
    return &p->shards[p->ranks > 1 ? p->rank : 0];
}

/* The plan's device made current for the enclosed work (base/memory_ops.h set_device): returns
   the caller's, which ra__device_leave puts back. No-ops on the CPU. */
static inline int ra__device_enter(const struct ringattn_plan *p)
{
    return p->be && p->be->memory->set_device ? p->be->memory->set_device(p->device) : -1;
}
static inline void ra__device_leave(const struct ringattn_plan *p, int previous)
{
    if (p->be && p->be->memory->set_device && previous >= 0) p->be->memory->set_device(previous);
}

/* The backend's memory work in the call's order (its device stream; base/memory_ops.h). */
static inline ringattn_status_t ra__plan_zero(struct ringattn_plan *p, void *dst, size_t bytes)
{
    return p->be->memory->zero(dst, bytes, ra__call_stream_device(&p->stream));
}
static inline ringattn_status_t ra__plan_from_host(struct ringattn_plan *p, void *dst,
                                                   const void *host, size_t bytes)
{
    return p->be->memory->copy_from_host(dst, host, bytes, ra__call_stream_device(&p->stream));
}
static inline ringattn_status_t ra__plan_to_host(struct ringattn_plan *p, void *host,
                                                 const void *src, size_t bytes)
{
    return p->be->memory->copy_to_host(host, src, bytes, ra__call_stream_device(&p->stream));
}

/* A live plan made by ringattn_plan_create, else an error naming fn: NULL is
   RINGATTN_ERR_INVALID_ARGUMENT, anything else (destroyed, never made) INVALID_USAGE. Safe on
   any pointer. */
ringattn_status_t ra__plan_check(const char *fn, const struct ringattn_plan *plan);

/* ringattn_plan_create's work (a collective over comm: every rank ends with the same status;
   the descriptor picks one of kinds: a KV cache plan for sharded_cache or cu_seqlens_new) and
   ringattn_plan_destroy's (NULL is a no-op; a plan not live is INVALID_USAGE). */
ringattn_status_t ra__plan_create(ringattn_comm_t comm, const ringattn_plan_desc_t *desc,
                                  const ra_plan_kinds *kinds, ringattn_plan_t *plan);
ringattn_status_t ra__plan_destroy(ringattn_plan_t plan);

#endif
