/* The calls' entry points below the public ones (api/calls.c, api/grid_calls.c). Internal. */
#ifndef RINGATTN_API_CALLS_H
#define RINGATTN_API_CALLS_H

#include "ringattn.h"

/* How a call runs beyond its tensors: a 2D plan's call of its inner ring (api/grid_calls.c). */
typedef struct ra_call_opts {
    ringattn_status_t prior; /* a failure so far: the call's agreement fails on every rank and
                                nothing else runs */
    int grads_f32;           /* backward: dK, dV as float32 sums (ring/call.h) */
    float *dq_f32;           /* with grads_f32 on one rank: the float32 dQ it sums into */
    ringattn_comm_t beacon;  /* another comm whose peers wait for this call: its heartbeats go
                                out while the ring computes */
} ra_call_opts;

struct ringattn_plan;
struct ra_view;
struct ra_backend;

/* What every call checks first: the caller's tensors struct (by its release's size, into *t),
   an LSE wherever there are rows, a stream the backend and each comm's transport (NULL ones
   skipped) can order the call on. */
ringattn_status_t ra__call_open(const char *fn, const struct ra_backend *be,
                               const ringattn_comm_t *comms, int num_comms,
                               const ringattn_tensors_t *caller, void *stream, int64_t rows,
                               ringattn_tensors_t *t);
/* A call that waits on the host for its queued work refuses a device stream that captures a
   CUDA graph, before anything is queued; the message says why: "a call <why><what>". */
ringattn_status_t ra__call_refuse_capture(const char *fn, const struct ra_backend *be,
                                          void *stream, const char *why, const char *what);
/* The backend's own limits on a tensor argument (kernels/backend.h: check_tensor), when it has
   some; a NULL tensor passes. */
ringattn_status_t ra__call_check_memory(const char *fn, const struct ringattn_plan *p,
                                        const char *name, const void *data,
                                        const struct ra_view *v);

/* A forward or backward call of a flat plan (a ring, a KV cache plan or one rank). */
ringattn_status_t ra__call_plan(const char *fn, ringattn_plan_t plan, const ringattn_tensors_t *t,
                                void *stream, int backward, const ra_call_opts *o);
/* The same of a 2D plan (plan/grid.h). */
ringattn_status_t ra__grid_call(const char *fn, ringattn_plan_t plan, const ringattn_tensors_t *t,
                                void *stream, int backward);

#endif
