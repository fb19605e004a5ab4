/* The ring driver's steps, shared by its forward (ring.c) and backward (ring_backward.c). */
#ifndef RINGATTN_RING_RING_STEPS_H
#define RINGATTN_RING_RING_STEPS_H

#include "comm/comm.h"
#include "ring/ring.h"

/* This rank's K and V, packed into the first exchange buffer (plan/buffers.h). */
ringattn_status_t ra__ring_pack_own(struct ringattn_plan *p, const ra_call *c);

/* The messages that pass the shard held at step t on to rank r + 1 (from buf, if it travels
   on), and receive from rank r - 1 the one it passes on (into buf); bytes: of a shard. */
ra_msg ra__ring_pass_send(const struct ringattn_plan *p, void *buf, int t,
                          size_t (*bytes)(const struct ringattn_plan *, int));
ra_msg ra__ring_pass_recv(const struct ringattn_plan *p, void *buf, int t,
                          size_t (*bytes)(const struct ringattn_plan *, int));

/* Starts passing the K/V held at step t (kv[cur]) on, and receiving the next into kv[!cur]. */
ringattn_status_t ra__ring_pass_kv(struct ringattn_plan *p, int cur, int t, ra_exchange *x);

/* Views of the K/V held at step t: the caller's own at step 0, else kv[cur]. */
void ra__ring_held_kv(const struct ringattn_plan *p, const ra_call *c, int cur, int t, ra_view *k,
                      ra_view *v);

/* The forward's steps; with stats_only the SPEC 9 recomputation of the backward: (m, l) of the
   rows whose LSE is lossy, into the plan's state buffers. */
ringattn_status_t ra__ring_forward_pass(struct ringattn_plan *p, const ra_call *c,
                                        const ra_prepared *pr, int stats_only);

#endif
