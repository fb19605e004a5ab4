/*
 * A plan's kind: a ring of shards (SPEC 8: training, the forward and the backward) or inference
 * against a KV cache (plan/cache.h: sharded_cache, cu_seqlens_new). The kind is decided once,
 * at creation, from the descriptor; the plan, the driver and the API then ask its table, never
 * a mode flag. The tables are wired by the composition root (api/kinds.c), which knows the
 * drivers of ring/. Internal.
 */
#ifndef RINGATTN_PLAN_KIND_H
#define RINGATTN_PLAN_KIND_H

#include <stddef.h>

#include "ringattn.h"

struct ringattn_plan;
struct ra_call; /* ring/call.h: the drivers' argument */

typedef struct ra_plan_kind {
    const char *name; /* "a ring", "a KV cache plan": in messages */
    /* creation: the key shards (and the local queries), who meets whom, the buffers */
    ringattn_status_t (*shards)(struct ringattn_plan *p);
    ringattn_status_t (*schedule)(struct ringattn_plan *p);
    ringattn_status_t (*buffers)(struct ringattn_plan *p);
    /* this rank's bytes sent ([0]) and received ([1]) by one forward and one backward call */
    void (*traffic)(const struct ringattn_plan *p, size_t forward[2], size_t backward[2]);
    /* every rank holds every query (a sharded cache): a call hashes Q and the ranks agree on it;
       the other ranks' key bias is gathered only for a selection (SPEC 6) */
    int same_queries;
    /* a rank's keys give a float32 partial (O, LSE) merged after the kernels (SPEC 5): they
       keep the running state even with one shard */
    int partials;
    /* a call waits on the host for its queued work (the partials' gather): a device stream
       that captures a CUDA graph is refused */
    int waits_on_host;
    /* the call's drivers; backward NULL: the kind is forward only */
    ringattn_status_t (*forward)(struct ringattn_plan *p, const struct ra_call *c);
    ringattn_status_t (*backward)(struct ringattn_plan *p, const struct ra_call *c);
} ra_plan_kind;

/* The kinds a plan can be, from the composition root: the descriptor picks one. */
typedef struct ra_plan_kinds {
    const ra_plan_kind *ring, *cache;
} ra_plan_kinds;

#endif
