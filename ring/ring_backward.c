/*
 * The ring driver, backward (SPEC 7). K/V travel as in the forward, and behind them the
 * float32 dK/dV/dBias sums of the shard, to which every rank that sees the shard adds its
 * part. The owner's own part stays at home: the sums start from zero at the next rank. Where a
 * shard's journey ends (a cut ring: DESIGN, the ring) its sums are finished and go straight back
 * to their owner, who adds its own part. dQ is summed locally in float32. Every
 * sum is taken in a fixed order, so repeated runs are bitwise identical.
 */
#include "base/error.h"
#include "comm/comm.h"
#include "plan/buffers.h"
#include "ring/ring.h"
#include "ring/ring_steps.h"

/* SPEC 9: rows whose LSE is lossy get their max and sum recomputed (forward, stats only); then
   D_i (less dLSE_i, SPEC 11) and the probabilities' shift and scale of every row, and the
   sinks' gradient. */
static ringattn_status_t prologue(struct ringattn_plan *p, const ra_call *c,
                                  const ra_prepared *pr)
{
    if (c->recompute) RA_TRY(ra__ring_forward_pass(p, c, pr, 1));
    const ra_bwd_prologue_io io = {.o = &c->a.o, .dout = &c->a.dout, .lse = c->a.lse,
                                   .row_m = c->recompute ? p->buf->m : NULL,
                                   .row_l = c->recompute ? p->buf->l : NULL, .stream = &p->stream,
                                   .sinks = c->a.sinks, .dlse = c->a.dlse, .dsinks = c->a.dsinks};
    return p->be->backward_prologue(p->ws, &p->kp, &io);
}

/* The step's io, without its K/V, its place in the ring and its outputs. */
static ra_bwd_io backward_io(struct ringattn_plan *p, const ra_call *c)
{
    const ra_bwd_io io = {.q = &c->a.q, .dout = &c->a.dout, .lse = c->a.lse,
                          .scale_q_first = c->scale_q_first, .stream = &p->stream};
    return io;
}

static ringattn_status_t backward_single(struct ringattn_plan *p, const ra_call *c,
                                         const ra_prepared *pr)
{
    ra_bwd_io io = backward_io(p, c);
    io.k = &c->a.k, io.v = &c->a.v, io.keys = &p->shards[0];
    io.dq = &c->a.dq, io.dk = &c->a.dk, io.dv = &c->a.dv;
    io.dyn = ra__ring_dyn_io(p, pr, 0, c->a.dbias);
    if (!c->grads_f32) return p->be->attend_backward(p->ws, &p->kp, &io);
    /* float32 sums of every gradient (ring/call.h), from zero; dQ then rounded once */
    const ra_kernel_params *k = &p->kp;
    const int64_t rows = k->queries->rows, keys = p->shards[0].rows;
    const size_t f = sizeof(float);
    RA_TRY(ra__plan_zero(p, c->a.dk.data, (size_t)keys * k->num_kv_heads * k->head_dim * f));
    RA_TRY(ra__plan_zero(p, c->a.dv.data, (size_t)keys * k->num_kv_heads * k->head_dim_v * f));
    RA_TRY(ra__plan_zero(p, c->dq_f32, (size_t)rows * k->num_heads * k->head_dim * f));
    if (c->a.dbias) RA_TRY(ra__plan_zero(p, c->a.dbias, (size_t)keys * k->bias_heads * f));
    const ra_view dq = {(char *)c->dq_f32, (int64_t)k->num_heads * k->head_dim, k->head_dim, f};
    io.dq = &dq, io.accumulate = 1;
    RA_TRY(p->be->attend_backward(p->ws, &p->kp, &io));
    const ra_copy to_dq = {&dq, &c->a.dq, RINGATTN_FLOAT32, k->dtype, rows, k->num_heads,
                           k->head_dim};
    return p->be->copy(&to_dq, &p->stream);
}

/* The finished sums into the caller's dK, dV (dBias) and the dQ sums into dQ, converted. */
static ringattn_status_t store_grads(struct ringattn_plan *p, const ra_call *c, const ra_view *dq)
{
    const ra_kernel_params *k = &p->kp;
    const int64_t rows = k->queries->rows;
    ra_view sk, sv;
    float *sb;
    ra__packed_sums_views(p, p->buf->own_part, rows, &sk, &sv, &sb);
    const ringattn_dtype_t f32 = RINGATTN_FLOAT32, dt = k->dtype, dkv = c->grads_f32 ? f32 : dt;
    const ra_copy copies[] = {
        {&sk, &c->a.dk, f32, dkv, rows, k->num_kv_heads, k->head_dim},
        {&sv, &c->a.dv, f32, dkv, rows, k->num_kv_heads, k->head_dim_v},
        {dq, &c->a.dq, f32, dt, rows, k->num_heads, k->head_dim},
    };
    for (size_t i = 0; i < sizeof copies / sizeof copies[0]; ++i)
        RA_TRY(p->be->copy(&copies[i], &p->stream));
    if (!c->a.dbias) return RINGATTN_SUCCESS;
    const ra_view from = {(char *)sb, rows, rows, sizeof(float)};
    const ra_view to = {(char *)c->a.dbias, rows, rows, sizeof(float)};
    const ra_copy db = {&from, &to, f32, f32, 1, k->bias_heads, (int)rows};
    return p->be->copy(&db, &p->stream);
}

/*
 * After step t > 0: the held shard's sums pass on (slot 0) unless its journey ends here, in
 * which case they go back to their owner (slot 1); this rank's own sums come back to it at the
 * end of their journey.
 */
static ringattn_status_t pass_sums(struct ringattn_plan *p, void *const sums[2], int cur, int t,
                                   int moving)
{
    const int r = p->rank, src = ra__held_shard(p, r, t);
    ra_exchange x = {.step = t};
    if (moving) {
        x.send[0] = ra__ring_pass_send(p, sums[cur], t, ra__shard_grad_bytes);
        x.recv[0] = ra__ring_pass_recv(p, sums[!cur], t, ra__shard_grad_bytes);
    }
    x.send[1] = (ra_msg){sums[cur], p->last_hop[src] == t ? ra__shard_grad_bytes(p, src) : 0, src};
    x.recv[1] = (ra_msg){p->buf->returned, p->last_hop[r] == t ? ra__shard_grad_bytes(p, r) : 0,
                         (r + t) % p->ranks};
    RA_TRY(ra__comm_start(p->comm, &x, &p->stream));
    return ra__comm_wait(p->comm, &x);
}

ringattn_status_t ra__ring_backward(struct ringattn_plan *p, const ra_call *c)
{
    ra_prepared pr;
    RA_TRY(ra__ring_prepare(p, c, 1, &pr));
    RA_TRY(prologue(p, c, &pr));
    if (p->ranks == 1) return backward_single(p, c, &pr);
    ra_buffers *b = p->buf;
    const int r = p->rank, H = p->kp.num_heads, D = p->kp.head_dim;
    const int64_t rows = p->kp.queries->rows;
    RA_TRY(ra__ring_pack_own(p, c));
    RA_TRY(ra__plan_zero(p, b->own_part, ra__shard_grad_bytes(p, r)));
    RA_TRY(ra__plan_zero(p, b->acc, (size_t)rows * H * D * sizeof(float)));
    const ra_view dq = {(char *)b->acc, (int64_t)H * D, D, sizeof(float)};
    void *sums[2] = {b->own_part, b->sums[1]}; /* step 0 sums into own_part; then 1, 0, ... */
    ringattn_status_t st = RINGATTN_SUCCESS;
    for (int t = 0, cur = 0; t < p->num_steps; ++t, cur ^= 1) {
        const int src = ra__held_shard(p, r, t), moving = t + 1 < p->num_steps;
        ra_exchange x;
        if (moving) RA_TRY(ra__ring_pass_kv(p, cur, t, &x));
        if (pr.run[t] && st == RINGATTN_SUCCESS) {
            ra_view k, v, sk, sv;
            float *sb;
            ra__ring_held_kv(p, c, cur, t, &k, &v);
            ra__packed_sums_views(p, sums[cur], p->shards[src].rows, &sk, &sv, &sb);
            ra_bwd_io io = backward_io(p, c);
            io.k = &k, io.v = &v, io.keys = &p->shards[src];
            io.dq = &dq, io.dk = &sk, io.dv = &sv, io.accumulate = 1;
            io.dyn = ra__ring_dyn_io(p, &pr, t, c->a.dbias ? sb : NULL);
            st = p->be->attend_backward(p->ws, &p->kp, &io);
        }
        if (moving) RA_TRY(ra__comm_wait(p->comm, &x));
        if (t == 0) { /* own_part keeps our part; the shard arriving for step 1 starts at zero */
            sums[0] = b->sums[0];
            if (moving)
                RA_TRY(ra__plan_zero(p, sums[1], ra__shard_grad_bytes(p, ra__held_shard(p, r, 1))));
            continue;
        }
        RA_TRY(pass_sums(p, sums, cur, t, moving));
    }
    RA_TRY(st);
    if (p->last_hop[r] > 0)
        RA_TRY(p->be->add_f32(b->own_part, b->returned,
                              ra__shard_grad_bytes(p, r) / sizeof(float), &p->stream));
    return store_grads(p, c, &dq);
}
