/* A call's scan of its inputs and the agreement of every rank on it (see call.h). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "comm/comm.h"
#include "ring/call.h"

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

ringattn_status_t ra__call_agree(struct ringattn_plan *p, const char *fn, ringattn_status_t local,
                                 int backward, ra_call *c)
{
    const int lse_in = backward;
    ra_scan scan = {0.0f, 0.0f, 0, 0};
    if (local == RINGATTN_SUCCESS) {
        const ra_scan_io io = {&c->a.q, &c->a.k, p->kp.queries->rows, ra__local_keys(p)->rows,
                               lse_in ? c->a.lse : NULL, p->comm != NULL, &p->stream};
        local = p->be->scan(p->ws, &p->kp, &io, &scan);
    }
    if (local == RINGATTN_SUCCESS && scan.on_device) { /* the kernels decide (one rank only) */
        RA_CHECK(p->comm == NULL, RINGATTN_ERR_INTERNAL, "%s: a device scan in a ring", fn);
        c->scale_q_first = 0;
        c->recompute = backward; /* the stats pass runs where some row's LSE is lossy */
        return RINGATTN_SUCCESS;
    }
    if (p->comm) { /* MIN of {-max |K|, -lossy}: the ring's max, any lossy */
        int64_t v[2] = {-float_order(scan.k_absmax), -(int64_t)(scan.lossy_rows > 0)};
        RA_TRY(ra__comm_agree(p->comm, fn, backward ? RA_CALL_BACKWARD : RA_CALL_FORWARD, p->id,
                              local, v, 2));
        scan.k_absmax = order_float(-v[0]);
        scan.lossy_rows = -v[1];
    }
    RA_TRY(local);
    if (p->be->scan_agreed) RA_TRY(p->be->scan_agreed(p->ws, &p->kp, &scan, &p->stream));
    /* SPEC 9: every partial sum of q . k is at most D max|q| max|k| (NaN: no; it propagates) */
    const double bound = (double)p->kp.head_dim * scan.q_absmax * scan.k_absmax;
    c->scale_q_first = bound > FLT_MAX / 2;
    c->recompute = scan.lossy_rows > 0;
    return RINGATTN_SUCCESS;
}
