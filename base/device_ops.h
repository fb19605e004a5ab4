/*
 * What a device-aware transport needs of a device runtime: streams, events and asynchronous
 * device-to-device copies, all on one device. A device backend provides the table
 * (kernels/cuda/memory.cu: CUDA's); comm/threads_device.c uses it, so that comm/ reaches no
 * runtime directly. Streams and events are the runtime's handles (cudaStream_t, cudaEvent_t).
 * Internal.
 */
#ifndef RINGATTN_BASE_DEVICE_OPS_H
#define RINGATTN_BASE_DEVICE_OPS_H

#include <stddef.h>

#include "ringattn.h"

typedef struct ra_device_ops {
    const char *name;
    /* Makes `device` current (-1: leaves it) and returns the previous current one (-1: error). */
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
} ra_device_ops;

#endif
