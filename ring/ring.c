/*
 * The ring driver, forward (and the helpers the backward shares). At step t rank r holds the
 * K/V of rank (r - t) mod P: it starts passing them to rank r + 1 (and receiving the next from
 * r - 1), attends its queries to them when the step computes, then waits for the exchange.
 * The exchange progresses while the kernels run (host transports: the kernels poll the plan's
 * stream between tiles). After num_steps (<= P) steps the ring stops: no rank needs a farther
 * shard. No backend #ifdefs: kernels, memory and transports are reached through their tables.
 */
#include "base/error.h"
#include "comm/comm.h"
#include "plan/buffers.h"
#include "ring/ring.h"
#include "ring/ring_steps.h"

ringattn_status_t ra__ring_pack_own(struct ringattn_plan *p, const ra_call *c)
{
    const ra_kernel_params *k = &p->kp;
    const int64_t rows = k->queries->rows;
    ra_view pk, pv;
    ra__packed_kv_views(p, p->buf->kv[0], rows, &pk, &pv);
    const ra_copy ck = {&c->a.k, &pk, k->dtype, k->dtype, rows, k->num_kv_heads, k->head_dim};
    const ra_copy cv = {&c->a.v, &pv, k->dtype, k->dtype, rows, k->num_kv_heads, k->head_dim_v};
    RA_TRY(p->be->copy(&ck, &p->stream));
    return p->be->copy(&cv, &p->stream);
}

ra_msg ra__ring_pass_send(const struct ringattn_plan *p, void *buf, int t,
                          size_t (*bytes)(const struct ringattn_plan *, int))
{
    const int r = p->rank;
    const ra_msg m = {buf, ra__moves_on(p, r, t) ? bytes(p, ra__held_shard(p, r, t)) : 0,
                      (r + 1) % p->ranks};
    return m;
}

ra_msg ra__ring_pass_recv(const struct ringattn_plan *p, void *buf, int t,
                          size_t (*bytes)(const struct ringattn_plan *, int))
{
    const int prev = (p->rank - 1 + p->ranks) % p->ranks;
    const ra_msg m = {buf, ra__moves_on(p, prev, t) ? bytes(p, ra__held_shard(p, prev, t)) : 0,
                      prev};
    return m;
}

ringattn_status_t ra__ring_pass_kv(struct ringattn_plan *p, int cur, int t, ra_exchange *x)
{
    ra_buffers *b = p->buf;
    *x = (ra_exchange){.step = t};
    x->send[0] = ra__ring_pass_send(p, b->kv[cur], t, ra__shard_kv_bytes);
    x->recv[0] = ra__ring_pass_recv(p, b->kv[!cur], t, ra__shard_kv_bytes);
    return ra__comm_start(p->comm, x, &p->stream);
}

void ra__ring_held_kv(const struct ringattn_plan *p, const ra_call *c, int cur, int t, ra_view *k,
                      ra_view *v)
{
    if (t == 0) { /* the caller's own K/V, read in place */
        *k = c->a.k;
        *v = c->a.v;
        return;
    }
    ra__packed_kv_views(p, p->buf->kv[cur], p->shards[ra__held_shard(p, p->rank, t)].rows, k, v);
}

/* The forward step's io, without its K/V and its place in the ring. */
static ra_fwd_io forward_io(struct ringattn_plan *p, const ra_call *c, int stats_only)
{
    const ra_fwd_io io = {.q = &c->a.q, .o = &c->a.o, .lse = c->a.lse, .m = p->buf->m,
                          .l = p->buf->l, .acc = p->buf->acc, .stats_only = stats_only,
                          .scale_q_first = c->scale_q_first, .stream = &p->stream,
                          .sinks = c->a.sinks};
    return io;
}

ringattn_status_t ra__ring_forward_pass(struct ringattn_plan *p, const ra_call *c,
                                        const ra_prepared *pr, int stats_only)
{
    if (p->ranks == 1) {
        ra_fwd_io io = forward_io(p, c, stats_only);
        io.k = &c->a.k, io.v = &c->a.v, io.keys = &p->shards[0], io.first = io.last = 1;
        io.dyn = ra__ring_dyn_io(p, pr, 0, NULL);
        return p->be->attend_forward(p->ws, &p->kp, &io);
    }
    RA_TRY(ra__ring_pack_own(p, c));
    ringattn_status_t st = RINGATTN_SUCCESS;
    for (int t = 0, cur = 0; t < p->num_steps; ++t, cur ^= 1) {
        const int moving = t + 1 < p->num_steps;
        ra_exchange x;
        if (moving) RA_TRY(ra__ring_pass_kv(p, cur, t, &x));
        /* the stats pass starts its state at step 0 whatever the selection skips */
        if ((pr->run[t] || (stats_only && t == 0)) && st == RINGATTN_SUCCESS) {
            ra_view k, v;
            ra__ring_held_kv(p, c, cur, t, &k, &v);
            ra_fwd_io io = forward_io(p, c, stats_only);
            io.k = &k, io.v = &v, io.keys = &p->shards[ra__held_shard(p, p->rank, t)];
            io.first = t == 0, io.last = t == pr->last;
            io.dyn = ra__ring_dyn_io(p, pr, t, NULL);
            st = p->be->attend_forward(p->ws, &p->kp, &io);
        }
        if (moving) RA_TRY(ra__comm_wait(p->comm, &x)); /* even after a failure */
    }
    return st;
}

ringattn_status_t ra__ring_forward(struct ringattn_plan *p, const ra_call *c)
{
    ra_prepared pr;
    RA_TRY(ra__ring_prepare(p, c, 0, &pr));
    return ra__ring_forward_pass(p, c, &pr, 0);
}
