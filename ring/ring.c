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
#include "base/dtype.h"
#include "base/error.h"
#include "base/log.h"
#include "ring/ring.h"
#include "ring/plan/schedule.h"
#include "ring/plan/select.h"

struct ra_ring {
    void *kv[2];     /* packed K then V of one shard, plan dtype */
    float *grad[2];  /* packed dK then dV sums of the shard at hand, float32 (backward) */
    float *own;      /* the sums of this rank's own shard that come back to it */
    float *home;     /* this rank's own part of them, which never travels */
    float *bias;     /* every key's bias [H_b, T] (global top-k selection only) */
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
    free(ring->home);
    free(ring->bias);
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
    const size_t bias = p->selects ? (size_t)p->bias_heads * (size_t)p->cu_q[p->num_seqs] : 0;
    ok = ok && (g->bias = malloc(bias * sizeof(float) + 1));
    ok = ok && (g->own = malloc(ra__shard_grad_bytes(p, p->rank) + 1)) &&
         (g->home = malloc(ra__shard_grad_bytes(p, p->rank) + 1)) &&
         (g->m = malloc(rows * H * sizeof(float))) && (g->l = malloc(rows * H * sizeof(float))) &&
         (g->acc = malloc(rows * H * dmax * sizeof(float)));
    if (!ok) {
        ra__ring_free(g);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "ringattn: out of memory (ring buffers)");
    }
    p->ring = g;
    return RINGATTN_SUCCESS;
}

/*
 * Packed views of a shard of `rows` rows in buf: [rows, H_kv, D], then [rows, H_kv, D_v] in
 * `elem`-byte elements, then (4-byte aligned) the float32 bias [H_b, rows] (schedule.c sizes it).
 */
static void packed_views(const struct ringattn_plan *p, void *buf, int64_t rows, size_t elem,
                         ra_view *k, ra_view *v, float **bias)
{
    const int64_t hk = p->num_kv_heads;
    const size_t kv = (size_t)(rows * hk * (p->head_dim + p->head_dim_v)) * elem;
    *k = (ra_view){buf, hk * p->head_dim, p->head_dim, elem};
    *v = (ra_view){(char *)buf + (size_t)(rows * hk * p->head_dim) * elem, hk * p->head_dim_v,
                   p->head_dim_v, elem};
    *bias = (float *)(void *)((char *)buf + ((kv + 3) & ~(size_t)3));
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

/* This rank's K, V and bias into the first exchange buffer. */
static void pack_own(struct ringattn_plan *p, const ra_args *a)
{
    const int64_t rows = p->q_shard.rows;
    ra_view pk, pv;
    float *bias;
    packed_views(p, p->ring->kv[0], rows, ra__dtype_size(p->dtype), &pk, &pv, &bias);
    copy_rows(&a->k, &pk, p->dtype, rows, p->num_kv_heads, p->head_dim);
    copy_rows(&a->v, &pv, p->dtype, rows, p->num_kv_heads, p->head_dim_v);
    if (p->bias_heads) memcpy(bias, a->key_bias, (size_t)rows * p->bias_heads * sizeof(float));
}

/*
 * SPEC 6 selection is global: every rank needs the bias of every key. The shards' biases go
 * once around the ring (P - 1 passes) into ring->bias, [H_b, T] in global token order.
 */
static ringattn_status_t gather_bias(struct ringattn_plan *p, const ra_args *a)
{
    struct ra_ring *g = p->ring;
    const int P = p->ranks, Hb = p->bias_heads;
    const int64_t total = p->cu_q[p->num_seqs];
    void *buf[2] = {g->grad[0], g->grad[1]};
    memcpy(buf[0], a->key_bias, (size_t)p->q_shard.rows * Hb * sizeof(float));
    for (int t = 0, cur = 0; t < P; ++t, cur ^= 1) {
        const int held = ra__held_shard(p, p->rank, t), prev = (p->rank - 1 + P) % P;
        const ra_shard *sh = &p->shards[held];
        ra_request req;
        if (t + 1 < P)
            RA_TRY(p->comm->ops->sendrecv_start(
                p->comm, buf[cur], (size_t)sh->rows * Hb * sizeof(float), (p->rank + 1) % P,
                buf[!cur], (size_t)p->shards[ra__held_shard(p, prev, t)].rows * Hb * sizeof(float),
                prev, 1000 + t, &req));
        const float *src = buf[cur];
        for (int i = 0; i < sh->num_segs; ++i) {
            const ra_segment *seg = &sh->segs[i];
            for (int hb = 0; hb < Hb; ++hb)
                for (int64_t j = 0; j < seg->span.count; ++j)
                    g->bias[hb * total + ra__segment_global(seg, p->cu_q, j)] =
                        src[hb * sh->rows + seg->row + j];
        }
        if (t + 1 < P) RA_TRY(p->comm->ops->wait(p->comm, &req));
    }
    return RINGATTN_SUCCESS;
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

/* The SPEC 6 part of a step's io: the held shard's bias and the local thresholds. */
static ra_dyn_io dyn_io(const struct ringattn_plan *p, const float *bias, int64_t rows,
                        const ra_thresholds *thr, float *dbias)
{
    const ra_dyn_io d = {p->bias_heads ? bias : NULL, rows, thr->b, thr->p, dbias};
    return d;
}

/* Thresholds of the local rows (SPEC 6), over every rank's bias in a ring. */
static ringattn_status_t thresholds(struct ringattn_plan *p, const ra_args *a, ra_thresholds *thr)
{
    if (p->selects && p->ranks > 1) {
        RA_TRY(gather_bias(p, a));
        return ra__select_thresholds(p, p->ring->bias, thr);
    }
    return ra__select_thresholds(p, a->key_bias, thr);
}

/*
 * SPEC 6 step skipping: does some local query row keep some key of the held shard (bias
 * [H_b, rows])? When, for every bias head, the shard's largest bias is below every local row's
 * threshold, no row keeps any of its keys, and the step's compute is skipped exactly (each of
 * its tiles would be skipped the same way, one check per tile). The K/V still travel on.
 */
static int shard_kept(const struct ringattn_plan *p, const ra_thresholds *thr, const float *bias,
                      int64_t rows)
{
    if (!thr->b) return 1; /* no selection */
    for (int hb = 0; hb < p->bias_heads; ++hb) {
        float bmax = -INFINITY;
        for (int64_t j = 0; j < rows; ++j) bmax = fmaxf(bmax, bias[hb * rows + j]);
        if (!(bmax < thr->lowest[hb])) return 1;
    }
    ra__log(RA_LOG_DEBUG, p->rank, p->ranks, "top-k: no local row keeps a key of the held shard: "
            "step skipped");
    return 0;
}

ringattn_status_t ra__ring_forward(struct ringattn_plan *p, const ra_args *a)
{
    ra_thresholds thr;
    if (p->ranks > 1) RA_TRY(ring_make(p));
    RA_TRY(thresholds(p, a, &thr));
    if (p->ranks == 1) {
        const ra_fwd_io io = {.q = &a->q, .k = &a->k, .v = &a->v, .qsh = &p->q_shard,
                              .ksh = &p->k_shard, .o = &a->o, .lse = a->lse, .first = 1,
                              .last = 1,
                              .dyn = dyn_io(p, a->key_bias, p->k_shard.rows, &thr, NULL)};
        return p->kops->attend_forward(p, &io);
    }
    struct ra_ring *g = p->ring;
    const size_t elem = ra__dtype_size(p->dtype);
    pack_own(p, a);
    const int last = last_compute_step(p);
    ringattn_status_t st = RINGATTN_SUCCESS;
    for (int t = 0, cur = 0; t < p->num_steps; ++t, cur ^= 1) {
        const int src = ra__held_shard(p, p->rank, t), moving = t + 1 < p->num_steps;
        ra_request req;
        progress_ctx pc = {p->comm, &req};
        if (moving) RA_TRY(pass_on(p, g->kv, cur, t, ra__shard_kv_bytes, t, &req));
        ra_view k, v;
        float *bias;
        packed_views(p, g->kv[cur], p->shards[src].rows, elem, &k, &v, &bias);
        /* the first and last compute steps start and finish the state: never skipped */
        if (p->step_compute[t] && st == RINGATTN_SUCCESS &&
            (t == 0 || t == last || shard_kept(p, &thr, bias, p->shards[src].rows))) {
            if (t == 0) k = a->k, v = a->v; /* the caller's own K/V, read in place */
            const ra_fwd_io io = {.q = &a->q, .k = &k, .v = &v, .qsh = &p->q_shard,
                                  .ksh = &p->shards[src], .o = &a->o, .lse = a->lse, .m = g->m,
                                  .l = g->l, .acc = g->acc, .first = t == 0, .last = t == last,
                                  .progress = {moving ? progress : NULL, &pc},
                                  .dyn = dyn_io(p, bias, p->shards[src].rows, &thr, NULL)};
            st = p->kops->attend_forward(p, &io);
        }
        if (moving) RA_TRY(p->comm->ops->wait(p->comm, &req)); /* even after a failed step */
    }
    return st;
}

/* dst += src over n floats (the owner's part plus what came back: a fixed order). */
static void add_floats(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

/*
 * Backward: K/V (and bias) travel as in the forward, and behind them the float32 dK/dV/dBias
 * sums of the shard, to which every rank that sees the shard adds its part. The owner's own
 * part stays at home: the sums start from zero at the next rank. Where a shard's journey ends
 * its sums are finished and go straight back to their owner (DESIGN: cut rings return dK/dV
 * directly), who adds its own part.
 */
ringattn_status_t ra__ring_backward(struct ringattn_plan *p, const ra_args *a)
{
    ra_thresholds thr;
    if (p->ranks > 1) RA_TRY(ring_make(p));
    RA_TRY(thresholds(p, a, &thr));
    if (p->ranks == 1) {
        const ra_bwd_io io = {.q = &a->q, .k = &a->k, .v = &a->v, .o = &a->o, .dout = &a->dout,
                              .lse = a->lse, .qsh = &p->q_shard, .ksh = &p->k_shard,
                              .dq = &a->dq, .dk = &a->dk, .dv = &a->dv,
                              .dyn = dyn_io(p, a->key_bias, p->k_shard.rows, &thr, a->dbias)};
        return p->kops->attend_backward(p, &io);
    }
    struct ra_ring *g = p->ring;
    const int P = p->ranks, r = p->rank, H = p->num_heads, Hk = p->num_kv_heads;
    const int D = p->head_dim, Dv = p->head_dim_v;
    const int64_t rows = p->q_shard.rows;
    const size_t elem = ra__dtype_size(p->dtype);
    ra_view gk, gv;
    float *gbias;
    pack_own(p, a);
    memset(g->home, 0, ra__shard_grad_bytes(p, r));
    memset(g->acc, 0, (size_t)rows * H * D * sizeof(float));
    const ra_view dq = {(char *)g->acc, (int64_t)H * D, D, sizeof(float)};
    void *grads[2] = {g->home, g->grad[1]}; /* step 0 sums into home; then grad[1], grad[0] */
    ringattn_status_t st = RINGATTN_SUCCESS;
    for (int t = 0, cur = 0; t < p->num_steps; ++t, cur ^= 1) {
        const int src = ra__held_shard(p, r, t), moving = t + 1 < p->num_steps;
        const int64_t src_rows = p->shards[src].rows;
        ra_request req, greq, rreq;
        progress_ctx pc = {p->comm, &req};
        if (moving) RA_TRY(pass_on(p, g->kv, cur, t, ra__shard_kv_bytes, 3 * t, &req));
        ra_view k, v;
        float *bias;
        packed_views(p, g->kv[cur], src_rows, elem, &k, &v, &bias);
        if (p->step_compute[t] && st == RINGATTN_SUCCESS && shard_kept(p, &thr, bias, src_rows)) {
            if (t == 0) k = a->k, v = a->v;
            packed_views(p, grads[cur], src_rows, sizeof(float), &gk, &gv, &gbias);
            const ra_bwd_io io = {.q = &a->q, .k = &k, .v = &v, .o = &a->o, .dout = &a->dout,
                                  .lse = a->lse, .qsh = &p->q_shard, .ksh = &p->shards[src],
                                  .dq = &dq, .dk = &gk, .dv = &gv, .accumulate = 1,
                                  .progress = {moving ? progress : NULL, &pc},
                                  .dyn = dyn_io(p, bias, src_rows, &thr, a->dbias ? gbias : NULL)};
            st = p->kops->attend_backward(p, &io);
        }
        if (moving) RA_TRY(p->comm->ops->wait(p->comm, &req));
        if (t == 0) { /* home keeps our part; the shard arriving for step 1 starts from zero */
            grads[0] = g->grad[0];
            if (moving) memset(grads[1], 0, ra__shard_grad_bytes(p, ra__held_shard(p, r, 1)));
            continue;
        }
        if (moving) RA_TRY(pass_on(p, grads, cur, t, ra__shard_grad_bytes, 3 * t + 1, &greq));
        /* Journeys ending here: send the held shard's sums to its owner, receive ours. */
        const size_t back = p->last_hop[src] == t ? ra__shard_grad_bytes(p, src) : 0;
        const size_t mine = p->last_hop[r] == t ? ra__shard_grad_bytes(p, r) : 0;
        RA_TRY(p->comm->ops->sendrecv_start(p->comm, grads[cur], back, src, g->own, mine,
                                            (r + t) % P, 3 * t + 2, &rreq));
        if (moving) RA_TRY(p->comm->ops->wait(p->comm, &greq));
        RA_TRY(p->comm->ops->wait(p->comm, &rreq));
    }
    RA_TRY(st);
    if (p->last_hop[r] > 0)
        add_floats(g->home, g->own, ra__shard_grad_bytes(p, r) / sizeof(float));
    packed_views(p, g->home, rows, sizeof(float), &gk, &gv, &gbias);
    copy_rows(&gk, &a->dk, p->dtype, rows, Hk, D);
    copy_rows(&gv, &a->dv, p->dtype, rows, Hk, Dv);
    copy_rows(&dq, &a->dq, p->dtype, rows, H, D);
    if (a->dbias) memcpy(a->dbias, gbias, (size_t)rows * p->bias_heads * sizeof(float));
    return RINGATTN_SUCCESS;
}
