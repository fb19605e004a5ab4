/*
 * ringattn_forward / ringattn_backward: argument checks, the call's agreement across the ring
 * (ring/call.c), then the ring driver.
 */
#include <math.h>

#include "base/memory_ops.h"
#include "base/error.h"
#include "base/log.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "ring/call.h"
#include "base/abi.h"
#include "plan/buffers.h"
#include "ring/ring.h"
#include "api/calls.h"

ringattn_status_t ra__call_open(const char *fn, const struct ra_backend *be,
                               const ringattn_comm_t *comms, int num_comms,
                               const ringattn_tensors_t *caller, void *stream, int64_t rows,
                               ringattn_tensors_t *t)
{
    RA_CHECK(caller != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: tensors: got NULL, expected a ringattn_tensors_t", fn);
    RA_TRY(ra__tensors_in(fn, caller, t));
    RA_CHECK(t->lse != NULL || rows == 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: lse: got NULL, expected [num_heads, T_q] float32", fn);
    RA_CHECK(stream == NULL || be->kind != RINGATTN_BACKEND_CPU, RINGATTN_ERR_UNSUPPORTED,
             "%s: stream: got %p, expected NULL for the CPU backend", fn, stream);
    for (int i = 0; i < num_comms; ++i)
        if (comms[i]) RA_TRY(ra__comm_check_stream(comms[i], fn, stream));
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__call_refuse_capture(const char *fn, const struct ra_backend *be,
                                          void *stream, const char *why, const char *what)
{
    if (!ra__memory_on_device(be->memory)) return RINGATTN_SUCCESS;
    /* a capture records work without running it, and a ring call's agreements, like a key
       bias's check and thresholds, wait on the host for values its queued work produces
       (DESIGN: the NCCL transport) */
    int capturing = 0;
    RA_TRY(be->memory->stream_capturing(stream, &capturing));
    RA_CHECK(!capturing, RINGATTN_ERR_UNSUPPORTED,
             "%s: stream: it is capturing a CUDA graph, but a call %s%s cannot be captured "
             "(it waits on the host for its queued work); call it outside the capture", fn, why,
             what);
    return RINGATTN_SUCCESS;
}

static ringattn_status_t check_call(const char *fn, ringattn_plan_t plan,
                                    const ringattn_tensors_t *caller, void *stream,
                                    ringattn_tensors_t *t)
{
    RA_TRY(ra__call_open(fn, plan->be, &plan->comm, 1, caller, stream, plan->kp.queries->rows,
                         t));
    plan->stream.device = stream; /* a device backend's calls run on the caller's stream */
    if (!plan->comm && !t->key_bias && !plan->kind->waits_on_host) return RINGATTN_SUCCESS;
    const int of_kind = !plan->comm && plan->kind->waits_on_host; /* "of a KV cache plan" */
    return ra__call_refuse_capture(fn, plan->be, stream,
                                   plan->comm ? "over a comm" : of_kind ? "of " : "with a key bias",
                                   of_kind ? plan->kind->name : "");
}

/* The backend's own limits on a tensor argument (kernels/backend.h), when it has some. */
ringattn_status_t ra__call_check_memory(const char *fn, const struct ringattn_plan *p,
                                        const char *name, const void *data, const ra_view *v)
{
    if (!p->be->check_tensor || data == NULL) return RINGATTN_SUCCESS;
    return p->be->check_tensor(p->ws, fn, name, data, v);
}

/*
 * SPEC 6 bias values: finite or -inf (a key no row may use). NaN would break the ranking's total
 * order and +inf the softmax, and either would give NaN outputs (SPEC 9 forbids them). Checked
 * on the host copy the call's preparation uses (ring/prepare.c).
 */
static ringattn_status_t check_bias(const char *fn, struct ringattn_plan *p, const char *name,
                                    const float *bias, int64_t keys, float *host)
{
    RA_TRY(ra__plan_to_host(p, host, bias, (size_t)(p->kp.bias_heads * keys) * sizeof(float)));
    for (int64_t i = 0; i < (int64_t)p->kp.bias_heads * keys; ++i)
        RA_CHECK(!isnan(host[i]) && host[i] != INFINITY, RINGATTN_ERR_INVALID_ARGUMENT,
                 "%s: %s[%lld, %lld]: got %g, expected a finite value or -inf", fn, name,
                 (long long)(i / keys), (long long)(i % keys), (double)host[i]);
    return RINGATTN_SUCCESS;
}

/* A KV cache plan's new tokens' K/V (and bias): read on the last rank, which attends them. */
static ringattn_status_t make_new_kv(const char *fn, struct ringattn_plan *p,
                                     const ringattn_tensors_t *t, ra_args *a)
{
    if (p->new_shard < 0 || p->rank != p->ranks - 1) return RINGATTN_SUCCESS;
    const ra_kernel_params *k = &p->kp;
    const int64_t tn = p->shards[p->new_shard].rows;
    RA_TRY(ra__view_make(fn, "k_new", t->k_new, k->dtype, tn, k->num_kv_heads, k->head_dim, 0,
                         &a->k_new));
    RA_TRY(ra__view_make(fn, "v_new", t->v_new, k->dtype, tn, k->num_kv_heads, k->head_dim_v, 0,
                         &a->v_new));
    RA_TRY(ra__call_check_memory(fn, p, "k_new", a->k_new.data, &a->k_new));
    RA_TRY(ra__call_check_memory(fn, p, "v_new", a->v_new.data, &a->v_new));
    if (!k->bias_heads) return RINGATTN_SUCCESS;
    RA_CHECK(t->key_bias_new != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: key_bias_new: got NULL, expected [key_bias_heads = %d, T_new = %lld] float32",
             fn, k->bias_heads, (long long)tn);
    a->key_bias_new = t->key_bias_new;
    RA_TRY(ra__call_check_memory(fn, p, "key_bias_new", a->key_bias_new, NULL));
    return check_bias(fn, p, "key_bias_new", a->key_bias_new, tn, p->buf->host_new_bias);
}

/* Q, K, V and O: the tensors both passes use (O is written by forward, read by backward). */
static ringattn_status_t make_qkvo(const char *fn, const struct ringattn_plan *p,
                                   const ringattn_tensors_t *t, int o_is_output, ra_args *a)
{
    const ra_kernel_params *k = &p->kp;
    const int H = k->num_heads, Hk = k->num_kv_heads, D = k->head_dim, Dv = k->head_dim_v;
    const int64_t tq = k->queries->rows, tk = ra__local_keys(p)->rows;
    RA_TRY(ra__view_make(fn, "q", t->q, k->dtype, tq, H, D, 0, &a->q));
    RA_TRY(ra__view_make(fn, "k", t->k, k->dtype, tk, Hk, D, 0, &a->k));
    RA_TRY(ra__view_make(fn, "v", t->v, k->dtype, tk, Hk, Dv, 0, &a->v));
    RA_TRY(ra__view_make(fn, "o", t->o, k->dtype, tq, H, Dv, o_is_output, &a->o));
    a->lse = t->lse;
    RA_CHECK(k->bias_heads == 0 || t->key_bias != NULL || tk == 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: key_bias: got NULL, expected [key_bias_heads = %d, T_k] float32", fn,
             k->bias_heads);
    a->key_bias = k->bias_heads ? t->key_bias : NULL;
    a->dbias = k->bias_heads ? t->dbias : NULL;
    a->sinks = t->sinks;
    return RINGATTN_SUCCESS;
}

/* The backward's own tensors: dO and the gradients (dK, dV float32 for grads_f32). */
static ringattn_status_t make_grads(const char *fn, const struct ringattn_plan *p,
                                    const ringattn_tensors_t *t, int grads_f32, ra_args *a)
{
    const ra_kernel_params *k = &p->kp;
    const int H = k->num_heads, Hk = k->num_kv_heads, D = k->head_dim, Dv = k->head_dim_v;
    const int64_t tq = k->queries->rows, tk = ra__local_keys(p)->rows;
    const ringattn_dtype_t dkv = grads_f32 ? RINGATTN_FLOAT32 : k->dtype;
    RA_TRY(ra__view_make(fn, "dout", t->dout, k->dtype, tq, H, Dv, 0, &a->dout));
    RA_TRY(ra__view_make(fn, "dq", t->dq, k->dtype, tq, H, D, 1, &a->dq));
    RA_TRY(ra__view_make(fn, "dk", t->dk, dkv, tk, Hk, D, 1, &a->dk));
    RA_CHECK(t->dsinks == NULL || t->sinks != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: dsinks: given without sinks, expected both or neither (SPEC 11)", fn);
    a->dsinks = t->dsinks;
    a->dlse = t->dlse;
    return ra__view_make(fn, "dv", t->dv, dkv, tk, Hk, Dv, 1, &a->dv);
}

/* After every tensor's shape and strides (so that a wrong stride is told as one whatever the
   memory): the memory each lives in, the bias values, and a KV cache plan's new tokens. */
static ringattn_status_t check_tensors(const char *fn, struct ringattn_plan *p, int backward,
                                       ra_args *a, const ringattn_tensors_t *t)
{
    const int64_t tq = p->kp.queries->rows, tk = ra__local_keys(p)->rows;
    const struct {
        const char *name;
        const void *data;
        const ra_view *view; /* the loaded ones: the backend's limits on their strides */
        int64_t rows;
        int backward_only;
    } tensors[] = {
        {"q", a->q.data, &a->q, tq, 0},          {"k", a->k.data, &a->k, tk, 0},
        {"v", a->v.data, &a->v, tk, 0},          {"o", a->o.data, NULL, tq, 0},
        {"lse", a->lse, NULL, tq, 0},            {"key_bias", a->key_bias, NULL, tk, 0},
        {"dout", a->dout.data, NULL, tq, 1},     {"dq", a->dq.data, NULL, tq, 1},
        {"dk", a->dk.data, NULL, tk, 1},         {"dv", a->dv.data, NULL, tk, 1},
        {"dbias", a->dbias, NULL, tk, 1},        {"sinks", a->sinks, NULL, 1, 0},
        {"dsinks", a->dsinks, NULL, 1, 1},       {"dlse", a->dlse, NULL, tq, 1},
    };
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
        if (tensors[i].rows && (backward || !tensors[i].backward_only))
            RA_TRY(ra__call_check_memory(fn, p, tensors[i].name, tensors[i].data,
                                         tensors[i].view));
    if (a->key_bias)
        RA_TRY(check_bias(fn, p, "key_bias", a->key_bias, tk, p->buf->host_own_bias));
    return make_new_kv(fn, p, t, a); /* a KV cache plan's, else nothing */
}

/* The backend's memory for backward calls, at the first one: before the call's agreement, so
   that a rank without the memory refuses the call on every rank and nothing moves. */
static ringattn_status_t backward_workspace(const char *fn, struct ringattn_plan *plan)
{
    if (!plan->be->backward_workspace) return RINGATTN_SUCCESS;
    size_t added = 0;
    const int previous = ra__device_enter(plan);
    const ringattn_status_t st = plan->be->backward_workspace(&plan->kp, plan->ws, &added);
    ra__device_leave(plan, previous);
    plan->ws_bytes += added;
    if (added)
        ra__log(RA_LOG_INFO, RA_SUB_PLAN, plan->rank, plan->ranks,
                "%s: the backward's workspace, made at the plan's first backward: %zu bytes "
                "(workspace now %zu)", fn, added, plan->ws_bytes);
    return st;
}

/* Both passes: a live plan (without one there is no ring to agree over), then every rank's
   checks and facts agreed before anything moves. */
static ringattn_status_t call_begin(const char *fn, ringattn_plan_t plan,
                                    const ringattn_tensors_t *caller, void *stream, int backward,
                                    const ra_call_opts *o, ra_call *c)
{
    if (ra__plan_check(fn, plan) != RINGATTN_SUCCESS) {
        ra__comm_refused(); /* no ring to agree over: the next agreement carries the refusal */
        return plan == NULL ? RINGATTN_ERR_INVALID_ARGUMENT : RINGATTN_ERR_INVALID_USAGE;
    }
    ringattn_tensors_t t;
    c->grads_f32 = o->grads_f32 && backward;
    c->dq_f32 = o->dq_f32;
    ringattn_status_t st = o->prior;
    if (st == RINGATTN_SUCCESS) st = check_call(fn, plan, caller, stream, &t);
    if (st == RINGATTN_SUCCESS && backward && plan->kind->backward == NULL)
        st = ra__fail(RINGATTN_ERR_UNSUPPORTED, "%s: the plan is %s, which is forward only", fn,
                      plan->kind->name);
    if (st == RINGATTN_SUCCESS && backward && plan->be->attend_backward == NULL)
        st = ra__fail(RINGATTN_ERR_UNSUPPORTED,
                      "%s: the %s backend has no backward kernels yet (forward only)", fn,
                      plan->be->name);
    if (st == RINGATTN_SUCCESS) st = make_qkvo(fn, plan, &t, !backward, &c->a);
    if (st == RINGATTN_SUCCESS && backward) st = make_grads(fn, plan, &t, c->grads_f32, &c->a);
    if (st == RINGATTN_SUCCESS) st = check_tensors(fn, plan, backward, &c->a, &t);
    if (st == RINGATTN_SUCCESS && backward) st = backward_workspace(fn, plan);
    return ra__call_agree(plan, fn, st, backward, c);
}

/*
 * Runs the call's ring (ring: its forward or backward driver) with the kernels' polls sending
 * this rank's heartbeats (comm.h), then agrees on its result: every rank returns the first
 * failing rank's status, so that no rank reports success for a call that failed elsewhere
 * (the backward's sums would lack that rank's part). A comm error leaves the plan pinned while
 * the transport may still run over its buffers (DESIGN, failure semantics).
 */
static ringattn_status_t call_ring(const char *fn, ringattn_plan_t plan, const ra_call *c,
                                   const ra_call_opts *o,
                                   ringattn_status_t (*ring)(struct ringattn_plan *,
                                                             const ra_call *))
{
    if (plan->comm) ra__comm_beacon_attach(plan->comm, &plan->stream);
    if (o->beacon) ra__comm_beacon_attach(o->beacon, &plan->stream);
    ringattn_status_t st = ring(plan, c);
    if (o->beacon) ra__comm_beacon_detach(o->beacon, &plan->stream);
    if (plan->comm) {
        ra__comm_beacon_detach(plan->comm, &plan->stream);
        st = ra__comm_conclude(plan->comm, fn, st);
        if (st == RINGATTN_ERR_COMM && plan->comm->ops->still_active(plan->comm)) plan->pinned = 1;
    }
    if (st == RINGATTN_SUCCESS) ra__clear_error();
    return st;
}

ringattn_status_t ra__call_plan(const char *fn, ringattn_plan_t plan, const ringattn_tensors_t *t,
                                void *stream, int backward, const ra_call_opts *o)
{
    const int previous = ra__registry_contains(plan) ? ra__device_enter(plan) : -1;
    ra_call c = {0};
    ringattn_status_t st = call_begin(fn, plan, t, stream, backward, o, &c);
    if (st == RINGATTN_SUCCESS)
        st = call_ring(fn, plan, &c, o, backward ? plan->kind->backward : plan->kind->forward);
    if (previous >= 0) ra__device_leave(plan, previous);
    return st;
}

/* A forward or backward call: a flat plan's, or a 2D plan's (api/grid_calls.c). */
static ringattn_status_t call(const char *fn, ringattn_plan_t plan, const ringattn_tensors_t *t,
                              void *stream, int backward)
{
    static const ra_call_opts plain = {RINGATTN_SUCCESS, 0, NULL, NULL};
    const int live = ra__registry_contains(plan);
    const ringattn_status_t st = live && plan->grid
                                     ? ra__grid_call(fn, plan, t, stream, backward)
                                     : ra__call_plan(fn, plan, t, stream, backward, &plain);
    if (st != RINGATTN_SUCCESS) { /* the log line of a failure is its message */
        const int still = ra__registry_contains(plan);
        ra__log_failure(RA_SUB_RING, still ? plan->rank : -1, still ? plan->ranks : 0, st);
    }
    return st;
}

ringattn_status_t ringattn_forward(ringattn_plan_t plan, const ringattn_tensors_t *t,
                                   void *stream)
{
    return call("ringattn_forward", plan, t, stream, 0);
}

ringattn_status_t ringattn_backward(ringattn_plan_t plan, const ringattn_tensors_t *t,
                                    void *stream)
{
    return call("ringattn_backward", plan, t, stream, 1);
}
