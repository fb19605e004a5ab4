/*
 * The simulated transport (ringattn_comm_create_simulated): rank `rank` of `size` ranks with
 * nobody behind it, so that a plan is made for any size on one machine and reports its schedule,
 * traffic and memory (ringattn_plan_get_info, ringattn-info). The control plane answers as if
 * every rank passed what this rank passes: a MIN or a MAX is the value itself, a SUM size times
 * it (saturated); an allgather holds this rank's bytes at its place and zeros at the others'
 * (only a call's key bias is gathered, and calls are refused). The data plane moves nothing:
 * check_stream refuses every forward and backward before its agreement, and an exchange is
 * refused as well. Nothing fails on its own: no peer, no deadline.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "comm/simulated.h"

#define NAME "ringattn comm simulated"

static ringattn_status_t refuse(const char *fn)
{
    return ra__fail(RINGATTN_ERR_UNSUPPORTED,
                    "%s: a simulated comm moves no data: its plans report their schedule and "
                    "traffic (ringattn_plan_get_info), their calls are refused",
                    fn);
}

static ringattn_status_t sim_allreduce(ringattn_comm_t c, int64_t *vals, int n, ra_reduce_op op)
{
    RA_CHECK(n >= 0 && n <= RA_ALLREDUCE_MAX, RINGATTN_ERR_INTERNAL,
             NAME ": allreduce of %d values, expected <= %d", n, RA_ALLREDUCE_MAX);
    const int64_t s = c->size;
    for (int i = 0; op == RA_REDUCE_SUM && i < n; ++i)
        vals[i] = vals[i] > INT64_MAX / s   ? INT64_MAX
                  : vals[i] < INT64_MIN / s ? INT64_MIN
                                            : vals[i] * s;
    return RINGATTN_SUCCESS;
}

static ringattn_status_t sim_allgather(ringattn_comm_t c, const void *send, void *recv,
                                       const size_t *bytes)
{
    size_t at = 0, total = 0;
    for (int r = 0; r < c->size; ++r) {
        at += r < c->rank ? bytes[r] : 0;
        total += bytes[r];
    }
    if (total == 0) return RINGATTN_SUCCESS; /* recv may be NULL */
    memset(recv, 0, total);
    if (bytes[c->rank]) memcpy((char *)recv + at, send, bytes[c->rank]);
    return RINGATTN_SUCCESS;
}

static ringattn_status_t sim_start(ringattn_comm_t c, ra_exchange *x, void *stream)
{
    return refuse(NAME);
}

static ringattn_status_t sim_test(ringattn_comm_t c, ra_exchange *x, int *done)
{
    return refuse(NAME);
}

static ringattn_status_t sim_wait(ringattn_comm_t c, ra_exchange *x) { return refuse(NAME); }

/* Before a call's agreement: forward and backward end here, with nothing moved or written. */
static ringattn_status_t sim_check_stream(ringattn_comm_t c, const char *fn, void *stream)
{
    return refuse(fn);
}

/* No peers: nobody to tell, nobody to hear from, nothing left running. */
static void sim_notify_failure(ringattn_comm_t c) {}
static int sim_peer_failed(ringattn_comm_t c) { return 0; }
static int sim_still_active(ringattn_comm_t c) { return 0; }
static void sim_beat(ringattn_comm_t c) {}
static void sim_destroy(ringattn_comm_t c) { free(c); }

static ringattn_status_t sim_split_grid(ringattn_comm_t c, int group, ringattn_comm_t out[2])
{
    RA_TRY(ra__comm_create_simulated(NAME ": split", c->rank % group, group, &out[0]));
    return ra__comm_create_simulated(NAME ": split", c->rank / group, c->size / group, &out[1]);
}

static const struct ra_comm_ops simulated_ops = {
    .name = "simulated",
    .allreduce_i64 = sim_allreduce,
    .allgather = sim_allgather,
    .exchange_start = sim_start,
    .exchange_test = sim_test,
    .exchange_wait = sim_wait,
    .notify_failure = sim_notify_failure,
    .peer_failed = sim_peer_failed,
    .still_active = sim_still_active,
    .beat = sim_beat,
    .check_stream = sim_check_stream,
    .destroy = sim_destroy,
    .split_grid = sim_split_grid,
};

ringattn_status_t ra__comm_create_simulated(const char *fn, int rank, int size,
                                            ringattn_comm_t *comm)
{
    struct ringattn_comm *c = calloc(1, sizeof *c);
    if (!c || ra__registry_add(c) != 0) {
        free(c);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    /* host memory (on_device 0), but `simulated` lets a plan of any backend be made on it */
    *c = (struct ringattn_comm){.ops = &simulated_ops, .rank = rank, .size = size, .device = -1,
                                .simulated = 1};
    *comm = c;
    return RINGATTN_SUCCESS;
}
