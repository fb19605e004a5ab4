/*
 * The host "stream" of a CPU plan: work that runs on the calling thread, in order. A host
 * transport (comm/mpi.c, comm/threads.c) attaches each exchange it has in flight on the stream
 * it was started on; the CPU kernels poll their stream between tiles, so the exchange of the
 * next ring step progresses while this one computes (an MPI rendezvous message only moves when
 * MPI is called). Kernels see only the stream, transports only what they attached. Internal.
 */
#ifndef RINGATTN_BASE_HOST_STREAM_H
#define RINGATTN_BASE_HOST_STREAM_H

#define RA_HOST_STREAM_MAX 4 /* exchanges in flight at once (the backward has two) */

typedef struct ra_host_stream {
    void *device; /* a device backend's stream of the call (a cudaStream_t; NULL: the default) */
    int n;
    struct {
        void (*poll)(void *ctx);
        void *ctx;
    } at[RA_HOST_STREAM_MAX];
} ra_host_stream;

/* The device stream a call's host stream carries (NULL stream or none: the default stream). */
static inline void *ra__host_stream_device(void *stream)
{
    return stream ? ((ra_host_stream *)stream)->device : NULL;
}

/* Calls poll(ctx) at every ra__host_stream_poll until detached. Returns 0, or -1 when full. */
static inline int ra__host_stream_attach(ra_host_stream *s, void (*poll)(void *), void *ctx)
{
    if (s->n == RA_HOST_STREAM_MAX) return -1;
    s->at[s->n].poll = poll;
    s->at[s->n++].ctx = ctx;
    return 0;
}

static inline void ra__host_stream_detach(ra_host_stream *s, const void *ctx)
{
    for (int i = 0; i < s->n; ++i)
        if (s->at[i].ctx == ctx) {
            s->at[i] = s->at[--s->n];
            return;
        }
}

/* From the thread that owns the stream (MPI may require it: MPI_THREAD_FUNNELED). */
static inline void ra__host_stream_poll(ra_host_stream *s)
{
    for (int i = 0; s && i < s->n; ++i) s->at[i].poll(s->at[i].ctx);
}

#endif
