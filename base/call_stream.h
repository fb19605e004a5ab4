/*
 * A call's stream: the device stream its work is ordered on (a device backend's; NULL: the
 * default), and on the CPU the host exchanges in flight. A host transport (comm/mpi.c,
 * comm/threads.c) attaches each exchange it has in flight on the stream it was started on; the
 * CPU kernels poll their stream between tiles, so the exchange of the next ring step progresses
 * while this one computes (an MPI rendezvous message only moves when MPI is called). Kernels see
 * only the stream, transports only what they attached. Internal.
 */
#ifndef RINGATTN_BASE_CALL_STREAM_H
#define RINGATTN_BASE_CALL_STREAM_H

#define RA_CALL_STREAM_MAX 4 /* exchanges in flight at once (the backward has two) */

/* A device backend's stream, opaque below it (a cudaStream_t: kernels/cuda/cuda_backend.h). */
typedef struct ra_device_stream ra_device_stream;

typedef struct ra_call_stream {
    ra_device_stream *device; /* the call's device stream (NULL: the default) */
    int n;
    struct {
        void (*poll)(void *ctx);
        void *ctx;
    } at[RA_CALL_STREAM_MAX];
} ra_call_stream;

/* The device stream a call's stream carries (NULL stream or none: the default stream). */
static inline ra_device_stream *ra__call_stream_device(void *stream)
{
    return stream ? ((ra_call_stream *)stream)->device : NULL;
}

/* Calls poll(ctx) at every ra__call_stream_poll until detached. Returns 0, or -1 when full. */
static inline int ra__call_stream_attach(ra_call_stream *s, void (*poll)(void *), void *ctx)
{
    if (s->n == RA_CALL_STREAM_MAX) return -1;
    s->at[s->n].poll = poll;
    s->at[s->n++].ctx = ctx;
    return 0;
}

static inline void ra__call_stream_detach(ra_call_stream *s, const void *ctx)
{
    for (int i = 0; i < s->n; ++i)
        if (s->at[i].ctx == ctx) {
            s->at[i] = s->at[--s->n];
            return;
        }
}

/* From the thread that owns the stream (MPI may require it: MPI_THREAD_FUNNELED). */
static inline void ra__call_stream_poll(ra_call_stream *s)
{
    for (int i = 0; s && i < s->n; ++i) s->at[i].poll(s->at[i].ctx);
}

#endif
