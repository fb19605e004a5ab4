/* A call's scan of its inputs and the agreement of every rank on it (see call.h). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "comm/comm.h"
#include "ring/call.h"
#include "plan/agree.h"
#include "plan/buffers.h"

/* A non-negative float (or NaN) as an int64 that orders like it: its bits. */
static int64_t float_order(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (int64_t)u;
}

static float order_float(int64_t v)
{
    const uint32_t u = (uint32_t)v;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A KV cache plan's new tokens' K joins the scan's max |K| (q_rows 0: no Q scanned again). */
static ringattn_status_t scan_new_keys(struct ringattn_plan *p, const ra_call *c, ra_scan *scan)
{
    if (!p->new_meets) return RINGATTN_SUCCESS;
    ra_scan extra;
    const ra_scan_io io = {&c->a.q, &c->a.k_new, 0, p->shards[p->new_shard].rows, NULL, 1,
                           &p->stream};
    RA_TRY(p->be->scan(p->ws, &p->kp, &io, &extra));
    if (float_order(extra.k_absmax) > float_order(scan->k_absmax)) scan->k_absmax = extra.k_absmax;
    return RINGATTN_SUCCESS;
}

/* A sharded cache's queries are the same on every rank: a hash of this rank's Q, packed (on the
   host: device backends copy it there), for the agreement to compare. */
static ringattn_status_t hash_queries(struct ringattn_plan *p, const ra_call *c, int64_t *hash)
{
    const ra_kernel_params *k = &p->kp;
    const int64_t rows = p->queries.rows;
    const size_t bytes = (size_t)rows * k->num_heads * k->head_dim * ra__dtype_size(k->dtype);
    const ra_view packed = {p->buf->q_packed, (int64_t)k->num_heads * k->head_dim, k->head_dim,
                            ra__dtype_size(k->dtype)};
    const ra_copy cq = {&c->a.q, &packed, k->dtype, k->dtype, rows, k->num_heads, k->head_dim};
    RA_TRY(p->be->copy(&cq, &p->stream));
    const void *host = p->buf->q_packed;
    if (p->buf->host_q) {
        RA_TRY(ra__plan_to_host(p, p->buf->host_q, p->buf->q_packed, bytes));
        host = p->buf->host_q;
    }
    *hash = bytes ? ra__hash_of(host, bytes) : 0;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__call_agree(struct ringattn_plan *p, const char *fn, ringattn_status_t local,
                                 int backward, ra_call *c)
{
    const int lse_in = backward;
    ra_scan scan = {0.0f, 0.0f, 0, 0};
    int64_t q_hash = 0;
    if (local == RINGATTN_SUCCESS) {
        const ra_scan_io io = {&c->a.q, &c->a.k, p->kp.queries->rows, ra__local_keys(p)->rows,
                               lse_in ? c->a.lse : NULL, p->comm != NULL || p->kind->waits_on_host,
                               &p->stream};
        local = p->be->scan(p->ws, &p->kp, &io, &scan);
    }
    if (local == RINGATTN_SUCCESS) local = scan_new_keys(p, c, &scan);
    const int same_queries = p->kind->same_queries && p->ranks > 1;
    if (local == RINGATTN_SUCCESS && same_queries) local = hash_queries(p, c, &q_hash);
    if (local == RINGATTN_SUCCESS && scan.on_device) { /* the kernels decide (one rank only) */
        RA_CHECK(p->comm == NULL, RINGATTN_ERR_INTERNAL, "%s: a device scan in a ring", fn);
        c->scale_q_first = 0;
        c->recompute = backward; /* the stats pass runs where some row's LSE is lossy */
        return RINGATTN_SUCCESS;
    }
    if (p->comm) { /* MIN of {-max |K|, -lossy, hash of Q, -hash}: the ring's max, any lossy */
        int64_t v[4] = {-float_order(scan.k_absmax), -(int64_t)(scan.lossy_rows > 0), q_hash,
                        -q_hash};
        RA_TRY(ra__comm_agree(p->comm, fn, backward ? RA_CALL_BACKWARD : RA_CALL_FORWARD, p->id,
                              local, v, same_queries ? 4 : 2));
        scan.k_absmax = order_float(-v[0]);
        scan.lossy_rows = -v[1];
        RA_CHECK(!same_queries || v[2] == -v[3], RINGATTN_ERR_INVALID_ARGUMENT,
                 "%s: q: differs between ranks (this is rank %d of %d), expected the same "
                 "queries on every rank of a sharded KV cache (sharded_cache)",
                 fn, p->rank, p->ranks);
    }
    RA_TRY(local);
    if (p->be->scan_agreed) RA_TRY(p->be->scan_agreed(p->ws, &p->kp, &scan, &p->stream));
    /* SPEC 9: every partial sum of q . k is at most D max|q| max|k| (NaN: no; it propagates) */
    const double bound = (double)p->kp.head_dim * scan.q_absmax * scan.k_absmax;
    c->scale_q_first = bound > FLT_MAX / 2;
    c->recompute = scan.lossy_rows > 0;
    return RINGATTN_SUCCESS;
}
