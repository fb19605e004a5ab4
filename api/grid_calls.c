/*
 * ringattn_forward / ringattn_backward of a 2D plan (plan/grid.h). The call's agreements run
 * over the group comm and then over the ring comm, which together reach every rank of the grid
 * (each group's outcome travels on every ring), so that every rank learns of any rank's refusal
 * or failure before anything further moves, and no rank returns success for a call that failed
 * on another:
 *   open (group, ring) - all-to-all in - group - the inner ring (its own agreements over the
 *   ring) - group - all-to-all out - close (group, ring).
 * A transport failure on either comm fails both (DESIGN, failure semantics).
 */
#include <string.h>

#include "api/calls.h"
#include "base/abi.h"
#include "base/error.h"
#include "base/memory_ops.h"
#include "comm/comm.h"
#include "plan/grid.h"
#include "plan/plan.h"
#include "ring/ulysses.h"

/* The caller's tensors at this rank's rows and every head. */
typedef struct grid_args {
    ra_view q, k, v, o, dout, dq, dk, dv, lse, dlse, bias, dbias;
    const float *sinks;
    float *dsinks;
} grid_args;

/* [heads, rows] float32, or a NULL view */
static ra_view by_heads(const float *data, int64_t rows)
{
    return (ra_view){(char *)data, 1, rows, sizeof(float)};
}

/* What every call checks first (api/calls.h), over both comms; a 2D call always waits on the
   host (its agreements), so a capturing stream is refused before anything moves. */
static ringattn_status_t open_call(const char *fn, const ra_grid *g,
                                   const ringattn_tensors_t *caller, void *stream, int64_t rows,
                                   ringattn_tensors_t *t)
{
    const ringattn_comm_t comms[2] = {g->group, g->ring};
    RA_TRY(ra__call_open(fn, g->inner->be, comms, 2, caller, stream, rows, t));
    return ra__call_refuse_capture(fn, g->inner->be, stream, "of a 2D plan", "");
}

static ringattn_status_t check_args(const char *fn, struct ringattn_plan *p,
                                    const ringattn_tensors_t *caller, void *stream, int backward,
                                    grid_args *a)
{
    const ra_grid *g = p->grid;
    const struct ringattn_plan *in = g->inner;
    const ra_kernel_params *k = &in->kp;
    const int H = g->heads[RA_HEADS_Q], Hk = g->heads[RA_HEADS_KV], Hb = g->heads[RA_HEADS_BIAS];
    const int D = k->head_dim, Dv = k->head_dim_v;
    const int64_t n = ra__grid_rows(g, g->member);
    const ringattn_dtype_t dt = k->dtype;
    ringattn_tensors_t t;
    RA_TRY(open_call(fn, g, caller, stream, n, &t));
    RA_CHECK(Hb == 0 || t.key_bias != NULL || n == 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: key_bias: got NULL, expected [key_bias_heads = %d, T_k] float32", fn, Hb);
    RA_CHECK(t.dsinks == NULL || t.sinks != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: dsinks: given without sinks, expected both or neither (SPEC 11)", fn);
    RA_TRY(ra__view_make(fn, "q", t.q, dt, n, H, D, 0, &a->q));
    RA_TRY(ra__view_make(fn, "k", t.k, dt, n, Hk, D, 0, &a->k));
    RA_TRY(ra__view_make(fn, "v", t.v, dt, n, Hk, Dv, 0, &a->v));
    RA_TRY(ra__view_make(fn, "o", t.o, dt, n, H, Dv, !backward, &a->o));
    a->lse = by_heads(t.lse, n);
    a->bias = by_heads(Hb ? t.key_bias : NULL, n);
    a->sinks = t.sinks;
    if (backward) {
        RA_TRY(ra__view_make(fn, "dout", t.dout, dt, n, H, Dv, 0, &a->dout));
        RA_TRY(ra__view_make(fn, "dq", t.dq, dt, n, H, D, 1, &a->dq));
        RA_TRY(ra__view_make(fn, "dk", t.dk, dt, n, Hk, D, 1, &a->dk));
        RA_TRY(ra__view_make(fn, "dv", t.dv, dt, n, Hk, Dv, 1, &a->dv));
        a->dlse = by_heads(t.dlse, n);
        a->dbias = by_heads(Hb ? t.dbias : NULL, n);
        a->dsinks = t.dsinks;
    }
    const struct {
        const char *name;
        const void *data;
        const ra_view *view;
    } memory[] = {
        {"q", a->q.data, &a->q},          {"k", a->k.data, &a->k},
        {"v", a->v.data, &a->v},          {"o", a->o.data, NULL},
        {"lse", a->lse.data, NULL},       {"key_bias", a->bias.data, NULL},
        {"sinks", a->sinks, NULL},        {"dout", a->dout.data, NULL},
        {"dq", a->dq.data, NULL},         {"dk", a->dk.data, NULL},
        {"dv", a->dv.data, NULL},         {"dlse", a->dlse.data, NULL},
        {"dbias", a->dbias.data, NULL},   {"dsinks", a->dsinks, NULL},
    };
    for (size_t i = 0; i < sizeof memory / sizeof memory[0]; ++i)
        if (n || !strcmp(memory[i].name, "sinks") || !strcmp(memory[i].name, "dsinks"))
            RA_TRY(ra__call_check_memory(fn, in, memory[i].name, memory[i].data,
                                         memory[i].view));
    return RINGATTN_SUCCESS;
}

/*
 * A KV cache plan's call (plan/grid.h): every query's Q of every head, O and LSE, and this
 * rank's share of the cache for its kv heads (k, v, k_new, v_new and the key bias: the inner
 * plan's own tensors). The inner plan gets this rank's heads of Q, O, LSE and the sinks as
 * views into the caller's.
 */
static ringattn_status_t cache_args(const char *fn, struct ringattn_plan *p,
                                    const ringattn_tensors_t *caller, void *stream,
                                    grid_args *a, ringattn_tensors_t *inner)
{
    const ra_grid *g = p->grid;
    const struct ringattn_plan *in = g->inner;
    const int H = g->heads[RA_HEADS_Q], D = in->kp.head_dim, Dv = in->kp.head_dim_v;
    const int64_t n = g->rows;
    ringattn_tensors_t t;
    RA_TRY(open_call(fn, g, caller, stream, n, &t));
    RA_TRY(ra__view_make(fn, "q", t.q, in->kp.dtype, n, H, D, 0, &a->q));
    RA_TRY(ra__view_make(fn, "o", t.o, in->kp.dtype, n, H, Dv, 1, &a->o));
    a->lse = by_heads(t.lse, n);
    a->sinks = t.sinks;
    RA_TRY(ra__call_check_memory(fn, in, "q", a->q.data, &a->q));
    RA_TRY(ra__call_check_memory(fn, in, "o", a->o.data, NULL));
    RA_TRY(ra__call_check_memory(fn, in, "lse", t.lse, NULL));
    RA_TRY(ra__call_check_memory(fn, in, "sinks", t.sinks, NULL));
    const int first = ra__grid_first_head(g, RA_HEADS_Q, g->member);
    *inner = t;
    inner->q = (ringattn_tensor_t){a->q.data + (size_t)first * a->q.head * a->q.elem, a->q.row,
                                   a->q.head};
    inner->o = (ringattn_tensor_t){a->o.data + (size_t)first * a->o.head * a->o.elem, a->o.row,
                                   a->o.head};
    inner->lse = t.lse ? t.lse + (size_t)first * (size_t)n : NULL;
    inner->sinks = t.sinks ? t.sinks + first : NULL;
    return RINGATTN_SUCCESS;
}

typedef struct mover {
    const ra_grid *g;
    const struct ra_backend *be;
    void *stream;
    ringattn_dtype_t dt;
} mover;

/* The layouts a tensor of the move has: [T, heads, dim] (Q, K, V, O and their gradients) or
   [heads, T] float32 (LSE, dLSE, the key bias and dBias), told, not guessed from strides (a
   [T, 1, 1] tensor has the strides of either). */
enum { BY_ROWS, BY_HEADS };

/* The inner plan's tensor of this rank's heads over the group's rows: packed by rows, or
   [heads, group rows]. */
static ra_view group_view(const ra_grid *g, void *data, int layout, int kind, int dim,
                          size_t elem)
{
    if (layout == BY_HEADS) return (ra_view){(char *)data, 1, g->rows, sizeof(float)};
    return (ra_view){(char *)data, (int64_t)g->each[kind] * dim, dim, elem};
}

static ringattn_status_t to_heads(const mover *m, const ra_view *mine, void *group, int layout,
                                  int kind, int dim, ringattn_dtype_t dt)
{
    if (!mine->data) return RINGATTN_SUCCESS;
    const ra_view gv = group_view(m->g, group, layout, kind, dim, mine->elem);
    const ra_ulysses_move mv = {mine, &gv, dt, dt, kind, dim};
    return ra__ulysses_to_heads(m->g, m->be, &mv, m->stream);
}

static ringattn_status_t to_tokens(const mover *m, const ra_view *mine, void *group, int layout,
                                   int kind, int dim, ringattn_dtype_t dt,
                                   ringattn_dtype_t group_dt)
{
    if (!mine->data) return RINGATTN_SUCCESS;
    const size_t elem = group_dt == RINGATTN_FLOAT32 ? sizeof(float) : mine->elem;
    const ra_view gv = group_view(m->g, group, layout, kind, dim, elem);
    const ra_ulysses_move mv = {mine, &gv, dt, group_dt, kind, dim};
    return ra__ulysses_to_tokens(m->g, m->be, &mv, m->stream);
}

static ringattn_status_t moves_in(const mover *m, const grid_args *a, int backward)
{
    const ra_grid *g = m->g;
    const int D = g->inner->kp.head_dim, Dv = g->inner->kp.head_dim_v;
    const ringattn_dtype_t f32 = RINGATTN_FLOAT32;
    RA_TRY(to_heads(m, &a->q, g->q, BY_ROWS, RA_HEADS_Q, D, m->dt));
    RA_TRY(to_heads(m, &a->k, g->k, BY_ROWS, RA_HEADS_KV, D, m->dt));
    RA_TRY(to_heads(m, &a->v, g->v, BY_ROWS, RA_HEADS_KV, Dv, m->dt));
    RA_TRY(to_heads(m, &a->bias, g->bias, BY_HEADS, RA_HEADS_BIAS, 1, f32));
    if (!backward) return RINGATTN_SUCCESS;
    RA_TRY(to_heads(m, &a->o, g->o, BY_ROWS, RA_HEADS_Q, Dv, m->dt));
    RA_TRY(to_heads(m, &a->dout, g->dout, BY_ROWS, RA_HEADS_Q, Dv, m->dt));
    RA_TRY(to_heads(m, &a->lse, g->lse, BY_HEADS, RA_HEADS_Q, 1, f32));
    return to_heads(m, &a->dlse, g->dlse, BY_HEADS, RA_HEADS_Q, 1, f32);
}

/* A KV cache plan: every head's O and LSE from the member that computed it. */
static ringattn_status_t gather_heads(const mover *m, const grid_args *a)
{
    const int Dv = m->g->inner->kp.head_dim_v;
    const ra_ulysses_move o = {&a->o, NULL, m->dt, m->dt, RA_HEADS_Q, Dv};
    RA_TRY(ra__ulysses_gather_heads(m->g, m->be, &o, m->stream));
    const ra_ulysses_move lse = {&a->lse, NULL, RINGATTN_FLOAT32, RINGATTN_FLOAT32, RA_HEADS_Q, 1};
    return ra__ulysses_gather_heads(m->g, m->be, &lse, m->stream);
}

/* dsinks: the inner plan's heads were written in place; the others are not this rank's. */
static ringattn_status_t zero_other_sinks(const mover *m, float *dsinks)
{
    const ra_grid *g = m->g;
    const int first = ra__grid_first_head(g, RA_HEADS_Q, g->member), hq = g->each[RA_HEADS_Q];
    const int H = g->heads[RA_HEADS_Q];
    void *dev = ra__call_stream_device(m->stream);
    if (first) RA_TRY(m->be->memory->zero(dsinks, (size_t)first * sizeof(float), dev));
    if (first + hq < H)
        RA_TRY(m->be->memory->zero(dsinks + first + hq, (size_t)(H - first - hq) * sizeof(float),
                                   dev));
    return RINGATTN_SUCCESS;
}

static ringattn_status_t moves_out(const mover *m, const grid_args *a, int backward)
{
    const ra_grid *g = m->g;
    const int D = g->inner->kp.head_dim, Dv = g->inner->kp.head_dim_v;
    const ringattn_dtype_t f32 = RINGATTN_FLOAT32;
    if (!backward) {
        RA_TRY(to_tokens(m, &a->o, g->o, BY_ROWS, RA_HEADS_Q, Dv, m->dt, m->dt));
        return to_tokens(m, &a->lse, g->lse, BY_HEADS, RA_HEADS_Q, 1, f32, f32);
    }
    const ringattn_dtype_t dkv = ra__grid_replicated(g, RA_HEADS_KV) ? f32 : m->dt;
    RA_TRY(to_tokens(m, &a->dq, g->dq, BY_ROWS, RA_HEADS_Q, D, m->dt, m->dt));
    RA_TRY(to_tokens(m, &a->dk, g->dk, BY_ROWS, RA_HEADS_KV, D, m->dt, dkv));
    RA_TRY(to_tokens(m, &a->dv, g->dv, BY_ROWS, RA_HEADS_KV, Dv, m->dt, dkv));
    RA_TRY(to_tokens(m, &a->dbias, g->dbias, BY_HEADS, RA_HEADS_BIAS, 1, f32, f32));
    return a->dsinks ? zero_other_sinks(m, a->dsinks) : RINGATTN_SUCCESS;
}

/* The inner plan's tensors: the group's tokens of this rank's heads. */
static ringattn_tensors_t inner_tensors(const ra_grid *g, const grid_args *a, int backward)
{
    const int first = ra__grid_first_head(g, RA_HEADS_Q, g->member);
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = g->q, t.k.data = g->k, t.v.data = g->v, t.o.data = g->o, t.lse = g->lse;
    t.key_bias = a->bias.data ? g->bias : NULL;
    t.sinks = a->sinks ? a->sinks + first : NULL;
    if (backward) {
        t.dout.data = g->dout, t.dq.data = g->dq, t.dk.data = g->dk, t.dv.data = g->dv;
        t.dlse = a->dlse.data ? g->dlse : NULL;
        t.dbias = a->dbias.data ? g->dbias : NULL;
        t.dsinks = a->dsinks ? a->dsinks + first : NULL;
    }
    return t;
}

/* A transport failure of one comm fails the other too, and the comm they were split from:
   every later call on any of them fails at once, on every rank (their peers are told). */
static ringattn_status_t fail_all(ra_grid *g, ringattn_status_t st)
{
    if (st != RINGATTN_ERR_COMM) return st;
    if (g->group->ops->still_active(g->group)) g->pinned = 1; /* plan/grid.c: grid_free */
    ringattn_comm_t all[3] = {g->group, g->ring, g->parent};
    for (int i = 0; i < 3; ++i)
        if (all[i] && !all[i]->failed) (void)ra__comm_fail(all[i], st);
    return st;
}

ringattn_status_t ra__grid_call(const char *fn, ringattn_plan_t p, const ringattn_tensors_t *t,
                                void *stream, int backward)
{
    ra_grid *g = p->grid;
    const ra_call_kind kind = backward ? RA_CALL_BACKWARD : RA_CALL_FORWARD;
    const int previous = ra__device_enter(g->inner);
    grid_args a;
    memset(&a, 0, sizeof a);
    ringattn_tensors_t inner = RINGATTN_TENSORS_INIT;
    ringattn_status_t st = g->cache ? cache_args(fn, p, t, stream, &a, &inner)
                                    : check_args(fn, p, t, stream, backward, &a);
    /* over one comm the call opens on it, as a flat ring's does: it carries the calls this
       process refused before they reached a comm (comm.h), which its split comms never do */
    if (g->parent) st = fail_all(g, ra__comm_agree(g->parent, fn, kind, g->id[2], st, NULL, 0));
    /* after a transport failure every comm of the grid is failed at once (fail_all), so the
       agreements below return at once instead of each waiting out its own deadline */
    st = fail_all(g, ra__comm_agree(g->group, fn, kind, g->id[0], st, NULL, 0));
    st = fail_all(g, ra__comm_agree(g->ring, fn, kind, g->id[1], st, NULL, 0));
    p->stream.device = stream;
    const mover m = {g, g->inner->be, &p->stream, g->inner->kp.dtype};
    if (st == RINGATTN_SUCCESS && !g->cache) st = moves_in(&m, &a, backward);
    st = fail_all(g, ra__comm_conclude(g->group, fn, st));
    if (!g->cache) inner = inner_tensors(g, &a, backward);
    const ra_call_opts o = {st, ra__grid_replicated(g, RA_HEADS_KV), g->dq_f32, g->group};
    g->ring->companion = g->group; /* its waits tell the group this rank is alive */
    st = fail_all(g, ra__call_plan(fn, g->inner, &inner, stream, backward, &o));
    g->ring->companion = NULL;
    st = fail_all(g, ra__comm_conclude(g->group, fn, st));
    if (st == RINGATTN_SUCCESS) st = g->cache ? gather_heads(&m, &a) : moves_out(&m, &a, backward);
    st = fail_all(g, ra__comm_conclude(g->group, fn, st));
    st = fail_all(g, ra__comm_conclude(g->ring, fn, st));
    ra__device_leave(g->inner, previous);
    if (st == RINGATTN_SUCCESS) ra__clear_error();
    return st;
}
