/* ringattn_forward / ringattn_backward: argument checks, then the backend (kernel table). */
#include <math.h>

#include "ring/plan/agree.h"
#include "base/error.h"
#include "ring/plan/plan.h"
#include "ring/ring.h"
#include "base/view.h"

/* The plan: without a live one there is no ring to agree over. */
static ringattn_status_t check_plan(const char *fn, ringattn_plan_t plan)
{
    RA_CHECK(plan != NULL, RINGATTN_ERR_INVALID_ARGUMENT, "%s: plan: got NULL, expected a plan",
             fn);
    RA_CHECK(ra__plan_is_live(plan), RINGATTN_ERR_INVALID_USAGE,
             "%s: plan: got %p, expected a live plan (destroyed or never created)", fn,
             (void *)plan);
    return RINGATTN_SUCCESS;
}

static ringattn_status_t check_call(const char *fn, ringattn_plan_t plan,
                                    const ringattn_tensors_t *t, void *stream)
{
    RA_CHECK(t != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: tensors: got NULL, expected a ringattn_tensors_t", fn);
    RA_CHECK(t->struct_size == sizeof(ringattn_tensors_t), RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: tensors->struct_size: got %zu, expected %zu (use RINGATTN_TENSORS_INIT)", fn,
             t->struct_size, sizeof(ringattn_tensors_t));
    RA_CHECK(t->lse != NULL || plan->total_q == 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: lse: got NULL, expected [num_heads, T_q] float32", fn);
    RA_CHECK(stream == NULL, RINGATTN_ERR_UNSUPPORTED,
             "%s: stream: got %p, expected NULL for the CPU backend", fn, stream);
    return RINGATTN_SUCCESS;
}

/*
 * SPEC 6 bias values: finite or -inf (a key no row may use). NaN would break the ranking's total
 * order and +inf the softmax, and either would give NaN outputs (SPEC 9 forbids them).
 */
static ringattn_status_t check_bias(const char *fn, const struct ringattn_plan *p,
                                    const float *bias)
{
    for (int64_t i = 0; i < (int64_t)p->bias_heads * p->total_k; ++i)
        RA_CHECK(!isnan(bias[i]) && bias[i] != INFINITY, RINGATTN_ERR_INVALID_ARGUMENT,
                 "%s: key_bias[%lld, %lld]: got %g, expected a finite value or -inf", fn,
                 (long long)(i / p->total_k), (long long)(i % p->total_k), (double)bias[i]);
    return RINGATTN_SUCCESS;
}

/* Q, K, V and O: the tensors both passes use (O is written by forward, read by backward). */
static ringattn_status_t make_qkvo(const char *fn, const struct ringattn_plan *p,
                                   const ringattn_tensors_t *t, int o_is_output, ra_args *a)
{
    const int H = p->num_heads, Hk = p->num_kv_heads, D = p->head_dim, Dv = p->head_dim_v;
    RA_TRY(ra__view_make(fn, "q", t->q, p->dtype, p->total_q, H, D, 0, &a->q));
    RA_TRY(ra__view_make(fn, "k", t->k, p->dtype, p->total_k, Hk, D, 0, &a->k));
    RA_TRY(ra__view_make(fn, "v", t->v, p->dtype, p->total_k, Hk, Dv, 0, &a->v));
    RA_TRY(ra__view_make(fn, "o", t->o, p->dtype, p->total_q, H, Dv, o_is_output, &a->o));
    a->lse = t->lse;
    RA_CHECK(p->bias_heads == 0 || t->key_bias != NULL || p->total_k == 0,
             RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: key_bias: got NULL, expected [key_bias_heads = %d, T_k] float32", fn,
             p->bias_heads);
    a->key_bias = p->bias_heads ? t->key_bias : NULL;
    a->dbias = p->bias_heads ? t->dbias : NULL;
    return a->key_bias ? check_bias(fn, p, a->key_bias) : RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_forward(ringattn_plan_t plan, const ringattn_tensors_t *t,
                                   void *stream)
{
    static const char fn[] = "ringattn_forward";
    ra_args a = {0};
    RA_TRY(check_plan(fn, plan));
    ringattn_status_t st = check_call(fn, plan, t, stream);
    if (st == RINGATTN_SUCCESS) st = make_qkvo(fn, plan, t, 1, &a);
    RA_TRY(ra__call_agree(plan, fn, st));
    RA_TRY(ra__ring_forward(plan, &a));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

/* The backward's own tensors: dO and the gradients. */
static ringattn_status_t make_grads(const char *fn, const struct ringattn_plan *p,
                                    const ringattn_tensors_t *t, ra_args *a)
{
    const int H = p->num_heads, Hk = p->num_kv_heads, D = p->head_dim, Dv = p->head_dim_v;
    RA_TRY(ra__view_make(fn, "dout", t->dout, p->dtype, p->total_q, H, Dv, 0, &a->dout));
    RA_TRY(ra__view_make(fn, "dq", t->dq, p->dtype, p->total_q, H, D, 1, &a->dq));
    RA_TRY(ra__view_make(fn, "dk", t->dk, p->dtype, p->total_k, Hk, D, 1, &a->dk));
    RA_TRY(ra__view_make(fn, "dv", t->dv, p->dtype, p->total_k, Hk, Dv, 1, &a->dv));
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_backward(ringattn_plan_t plan, const ringattn_tensors_t *t,
                                    void *stream)
{
    static const char fn[] = "ringattn_backward";
    ra_args a = {0};
    RA_TRY(check_plan(fn, plan));
    ringattn_status_t st = check_call(fn, plan, t, stream);
    if (st == RINGATTN_SUCCESS) st = make_qkvo(fn, plan, t, 0, &a);
    if (st == RINGATTN_SUCCESS) st = make_grads(fn, plan, t, &a);
    RA_TRY(ra__call_agree(plan, fn, st));
    RA_TRY(ra__ring_backward(plan, &a));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}
