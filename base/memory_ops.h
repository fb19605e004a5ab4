/*
 * A backend's memory and its order, as one table: allocation, zeroing and host copies for the
 * ring driver (kernels/backend.h `memory`), and on a device also the streams, events and
 * asynchronous device-to-device copies a device-aware transport needs (comm/threads_device.c,
 * comm/nccl.c), so that neither ring/ nor comm/ reaches a runtime directly. Every entry takes
 * the runtime's own handles (a cudaStream_t, a cudaEvent_t; NULL: the default stream), never
 * the call's ra_call_stream. Host memory's table (kernels/cpu/memory.c) has no streams: its
 * stream and event entries are NULL and its stream arguments unused. Internal.
 */
#ifndef RINGATTN_BASE_MEMORY_OPS_H
#define RINGATTN_BASE_MEMORY_OPS_H

#include <stddef.h>

#include "ringattn.h"

typedef struct ra_memory_ops {
    const char *name;
    /* Makes `device` current (-1: leaves it) and returns the previous current one (-1: error);
       NULL for host memory. */
    int (*set_device)(int device);
    ringattn_status_t (*stream_create)(void **stream); /* non-blocking, high priority */
    void (*stream_destroy)(void *stream);
    ringattn_status_t (*event_create)(void **event); /* without timing */
    void (*event_destroy)(void *event);
    ringattn_status_t (*event_record)(void *event, void *stream);
    /* Work queued on stream after this waits for the event's latest record. */
    ringattn_status_t (*stream_wait)(void *stream, void *event);
    ringattn_status_t (*copy_async)(void *dst, const void *src, size_t bytes, void *stream);
    /* *done = 1 once the event's latest record has run; never waits. */
    ringattn_status_t (*event_query)(void *event, int *done);
    /* Device memory, and host memory to and from it (control-plane values), ordered on stream:
       from_host returns once the host bytes are read, to_host once they are written (it waits
       for the stream: a transport's own, never the legacy default stream, which would wait
       for every blocking stream of the device, the caller's queued work among them). */
    ringattn_status_t (*alloc)(size_t bytes, void **ptr);
    void (*free)(void *ptr);
    ringattn_status_t (*zero)(void *dst, size_t bytes, void *stream);
    ringattn_status_t (*copy_from_host)(void *dst, const void *host, size_t bytes, void *stream);
    ringattn_status_t (*copy_to_host)(void *host, const void *src, size_t bytes, void *stream);
    /* *capturing = 1 while stream is capturing a graph (its work recorded, not run). */
    ringattn_status_t (*stream_capturing)(void *stream, int *capturing);
} ra_memory_ops;

/* Device memory (a table with streams), which host transports cannot move. */
static inline int ra__memory_on_device(const ra_memory_ops *m) { return m->stream_create != NULL; }

#endif
