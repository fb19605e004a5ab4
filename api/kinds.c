/* The plan kinds (plan/kind.h), wired here where the plan's creation and ring/'s drivers meet:
   a ring (SPEC 8, forward and backward) and a KV cache plan (plan/cache.h, forward only). */
#include "api/kinds.h"
#include "plan/buffers.h"
#include "plan/cache.h"
#include "plan/schedule.h"
#include "ring/ring.h"

static const ra_plan_kind ring = {
    .name = "a ring",
    .shards = ra__ring_shards,
    .schedule = ra__schedule_make,
    .buffers = ra__buffers_make,
    .traffic = ra__schedule_traffic,
    .forward = ra__ring_forward,
    .backward = ra__ring_backward,
};

static const ra_plan_kind cache = {
    .name = "a KV cache plan (sharded_cache or cu_seqlens_new)",
    .shards = ra__cache_shards,
    .schedule = ra__cache_schedule,
    .buffers = ra__cache_buffers,
    .traffic = ra__cache_traffic,
    .same_queries = 1,
    .partials = 1,
    .waits_on_host = 1,
    .forward = ra__cache_forward,
    .backward = NULL, /* inference */
};

const ra_plan_kinds ra__plan_kinds = {&ring, &cache};
