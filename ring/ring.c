/*
 * The ring driver. At step t rank r holds the K/V of rank (r - t) mod P: it starts passing them
 * to rank r + 1 (and receiving the next from r - 1), attends its queries to them when the
 * schedule says the pair is not EMPTY, then waits. The kernel calls the transport's test
 * between tiles so the transfer progresses while it computes. After num_steps (<= P) steps the
 * ring stops: no rank needs a farther shard. No backend #ifdefs: kernels and transports are
 * reached through their tables.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "kernels/dtype.h"
#include "ring/error.h"
#include "ring/ring.h"
#include "ring/schedule.h"

struct ra_ring {
    void *kv[2];     /* packed K then V of one shard, plan dtype */
    float *grad[2];  /* packed dK then dV sums of the shard at hand, float32 (backward) */
    float *own;      /* the finished sums of this rank's own shard */
    float *m, *l;    /* forward state [H, rows] */
    float *acc;      /* forward state [rows, H, D_v]; backward dQ sums [rows, H, D] */
};

void ra__ring_free(struct ra_ring *ring)
{
    if (!ring) return;
    for (int i = 0; i < 2; ++i) {
        free(ring->kv[i]);
        free(ring->grad[i]);
    }
    free(ring->own);
    free(ring->m);
    free(ring->l);
    free(ring->acc);
    free(ring);
}

static ringattn_status_t ring_make(struct ringattn_plan *p)
{
    if (p->ring) return RINGATTN_SUCCESS;
    size_t kv = 1, grad = 1;
    for (int r = 0; r < p->ranks; ++r) {
        if (ra__shard_kv_bytes(p, r) > kv) kv = ra__shard_kv_bytes(p, r);
        if (ra__shard_grad_bytes(p, r) > grad) grad = ra__shard_grad_bytes(p, r);
    }
    const size_t rows = (size_t)p->q_shard.rows + 1, H = (size_t)p->num_heads;
    const size_t dmax = (size_t)(p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v);
    struct ra_ring *g = calloc(1, sizeof *g);
    int ok = g != NULL;
    for (int i = 0; ok && i < 2; ++i)
        ok = (g->kv[i] = malloc(kv)) && (g->grad[i] = malloc(grad));
    ok = ok && (g->own = malloc(ra__shard_grad_bytes(p, p->rank) + 1)) && (g->m = malloc(rows * H * sizeof(float))) && (g->l = malloc(rows * H * sizeof(float)))
         && (g->acc = malloc(rows * H * dmax * sizeof(float)));
    if (!ok) {
        ra__ring_free(g);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "ringattn: out of memory (ring buffers)");
    }
    p->ring = g;
    return RINGATTN_SUCCESS;
}

/* Packed views of a shard of `rows` rows in buf: first [rows, H_kv, D], then [rows, H_kv, D_v]. */
static void packed_views(const struct ringattn_plan *p, void *buf, int64_t rows, size_t elem,
                         ra_view *k, ra_view *v)
{
    const int64_t hk = p->num_kv_heads;
    *k = (ra_view){buf, hk * p->head_dim, p->head_dim, elem};
    *v = (ra_view){(char *)buf + (size_t)(rows * hk * p->head_dim) * elem, hk * p->head_dim_v,
                   p->head_dim_v, elem};
}

/* Copies rows x heads x dim elements between views; float32 src to dst_dt converts. */
static void copy_rows(const ra_view *src, const ra_view *dst, ringattn_dtype_t dst_dt,
                      int64_t rows, int heads, int dim)
{
    for (int64_t t = 0; t < rows; ++t)
        for (int h = 0; h < heads; ++h) {
            const void *s = ra__view_at(src, t, h);
            void *d = ra__view_at(dst, t, h);
            if (src->elem == dst->elem) {
                memcpy(d, s, (size_t)dim * dst->elem);
                continue;
            }
            const float *f = s; /* float32 sums into a 16-bit dtype */
            uint16_t *o = d;
            for (int c = 0; c < dim; ++c)
                o[c] = dst_dt == RINGATTN_FLOAT16 ? ra__f32_to_f16(f[c]) : ra__f32_to_bf16(f[c]);
        }
}

typedef struct progress_ctx {
    ringattn_comm_t comm;
    ra_request *req;
} progress_ctx;

static void progress(void *ctx)
{
    progress_ctx *c = ctx;
    int done;
    (void)c->comm->ops->test(c->comm, c->req, &done); /* a failure shows again in wait */
}

static int last_compute_step(const struct ringattn_plan *p)
{
    int last = 0;
    for (int t = 0; t < p->num_steps; ++t)
        if (p->step_compute[t]) last = t;
    return last;
}

/*
 * Starts passing the shard held at step t (its bytes in buf[cur]) on to the next rank if it
 * travels on, and receiving into buf[!cur] the shard the previous rank passes on.
 */
static ringattn_status_t pass_on(struct ringattn_plan *p, void *const buf[2], int cur, int t,
                                 size_t (*bytes)(const struct ringattn_plan *, int), int tag,
                                 ra_request *req)
{
    const int P = p->ranks, r = p->rank, prev = (r - 1 + P) % P;
    const size_t out = ra__moves_on(p, r, t) ? bytes(p, ra__held_shard(p, r, t)) : 0;
    const size_t in = ra__moves_on(p, prev, t) ? bytes(p, ra__held_shard(p, prev, t)) : 0;
    return p->comm->ops->sendrecv_start(p->comm, buf[cur], out, (r + 1) % P, buf[!cur], in, prev,
                                        tag, req);
}

ringattn_status_t ra__ring_forward(struct ringattn_plan *p, const ra_args *a)
{
    if (p->ranks == 1) {
        const ra_fwd_io io = {&a->q, &a->k, &a->v, &p->q_shard, &p->k_shard, &a->o, a->lse,
                              NULL,  NULL,  NULL,  1,           1,           {NULL, NULL}};
        return p->kops->attend_forward(p, &io);
    }
    RA_TRY(ring_make(p));
    struct ra_ring *g = p->ring;
    const size_t elem = ra__dtype_size(p->dtype);
    ra_view pk, pv;
    packed_views(p, g->kv[0], p->q_shard.rows, elem, &pk, &pv);
    copy_rows(&a->k, &pk, p->dtype, p->q_shard.rows, p->num_kv_heads, p->head_dim);
    copy_rows(&a->v, &pv, p->dtype, p->q_shard.rows, p->num_kv_heads, p->head_dim_v);
    const int last = last_compute_step(p);
    ringattn_status_t st = RINGATTN_SUCCESS;
    for (int t = 0, cur = 0; t < p->num_steps; ++t, cur ^= 1) {
        const int src = ra__held_shard(p, p->rank, t), moving = t + 1 < p->num_steps;
        ra_request req;
        progress_ctx pc = {p->comm, &req};
        if (moving) RA_TRY(pass_on(p, g->kv, cur, t, ra__shard_kv_bytes, t, &req));
        if (p->step_compute[t] && st == RINGATTN_SUCCESS) {
            ra_view k = a->k, v = a->v; /* step 0: the caller's own K/V, read in place */
            if (t > 0) packed_views(p, g->kv[cur], p->shards[src].rows, elem, &k, &v);
            const ra_fwd_io io = {&a->q,   &k,   &v,    &p->q_shard, &p->shards[src],
                                  &a->o,   a->lse, g->m, g->l,        g->acc,
                                  t == 0,  t == last, {moving ? progress : NULL, &pc}};
            st = p->kops->attend_forward(p, &io);
        }
        if (moving) RA_TRY(p->comm->ops->wait(p->comm, &req)); /* even after a failed step */
    }
    return st;
}

/*
 * Backward: K/V travel as in the forward, and behind them the float32 dK/dV sums of the shard,
 * to which every rank that sees the shard adds its part. Where a shard's journey ends its sums
 * are finished and go straight back to their owner (DESIGN: cut rings return dK/dV directly).
 */
ringattn_status_t ra__ring_backward(struct ringattn_plan *p, const ra_args *a)
{
    if (p->ranks == 1) {
        const ra_bwd_io io = {&a->q,       &a->k,  &a->v,  &a->o,  &a->dout, a->lse, &p->q_shard,
                              &p->k_shard, &a->dq, &a->dk, &a->dv, 0,        {NULL, NULL}};
        return p->kops->attend_backward(p, &io);
    }
    RA_TRY(ring_make(p));
    struct ra_ring *g = p->ring;
    const int P = p->ranks, r = p->rank, H = p->num_heads, Hk = p->num_kv_heads;
    const int D = p->head_dim, Dv = p->head_dim_v;
    const int64_t rows = p->q_shard.rows;
    const size_t elem = ra__dtype_size(p->dtype);
    ra_view pk, pv, gk, gv;
    packed_views(p, g->kv[0], rows, elem, &pk, &pv);
    copy_rows(&a->k, &pk, p->dtype, rows, Hk, D);
    copy_rows(&a->v, &pv, p->dtype, rows, Hk, Dv);
    memset(g->grad[0], 0, ra__shard_grad_bytes(p, r));
    memset(g->acc, 0, (size_t)rows * H * D * sizeof(float));
    const ra_view dq = {(char *)g->acc, (int64_t)H * D, D, sizeof(float)};
    void *grads[2] = {g->grad[0], g->grad[1]};
    ringattn_status_t st = RINGATTN_SUCCESS;
    for (int t = 0, cur = 0; t < p->num_steps; ++t, cur ^= 1) {
        const int src = ra__held_shard(p, r, t), moving = t + 1 < p->num_steps;
        ra_request req, greq, rreq;
        progress_ctx pc = {p->comm, &req};
        if (moving) RA_TRY(pass_on(p, g->kv, cur, t, ra__shard_kv_bytes, 3 * t, &req));
        if (p->step_compute[t] && st == RINGATTN_SUCCESS) {
            ra_view k = a->k, v = a->v;
            if (t > 0) packed_views(p, g->kv[cur], p->shards[src].rows, elem, &k, &v);
            packed_views(p, grads[cur], p->shards[src].rows, sizeof(float), &gk, &gv);
            const ra_bwd_io io = {&a->q, &k,  &v,  &a->o, &a->dout, a->lse,
                                  &p->q_shard, &p->shards[src], &dq, &gk, &gv, 1,
                                  {moving ? progress : NULL, &pc}};
            st = p->kops->attend_backward(p, &io);
        }
        if (moving) RA_TRY(p->comm->ops->wait(p->comm, &req));
        if (t == 0 && p->last_hop[r] == 0) memcpy(g->own, grads[cur], ra__shard_grad_bytes(p, r));
        if (moving) RA_TRY(pass_on(p, grads, cur, t, ra__shard_grad_bytes, 3 * t + 1, &greq));
        /* Journeys ending here: send the held shard's sums home, receive ours. */
        const size_t home = t > 0 && p->last_hop[src] == t ? ra__shard_grad_bytes(p, src) : 0;
        const size_t mine = t > 0 && p->last_hop[r] == t ? ra__shard_grad_bytes(p, r) : 0;
        RA_TRY(p->comm->ops->sendrecv_start(p->comm, grads[cur], home, src, g->own, mine,
                                            (r + t) % P, 3 * t + 2, &rreq));
        if (moving) RA_TRY(p->comm->ops->wait(p->comm, &greq));
        RA_TRY(p->comm->ops->wait(p->comm, &rreq));
    }
    RA_TRY(st);
    packed_views(p, g->own, rows, sizeof(float), &gk, &gv);
    copy_rows(&gk, &a->dk, p->dtype, rows, Hk, D);
    copy_rows(&gv, &a->dv, p->dtype, rows, Hk, Dv);
    copy_rows(&dq, &a->dq, p->dtype, rows, H, D);
    return RINGATTN_SUCCESS;
}
