/*
 * The data plane's all-to-all (comm.h), built from the exchanges every transport has: P - 1
 * pairwise rounds, each started and waited for in turn. A round pairs this rank's send to r + k
 * with its receive from r - k, which is that rank's send to r in the same round, so every round
 * completes without waiting for another. One exchange at a time keeps to what every transport
 * allows (a device comm has one in flight per rank).
 */
#include "base/error.h"
#include "comm/comm.h"

ringattn_status_t ra__comm_alltoall(ringattn_comm_t c, const ra_msg *send, const ra_msg *recv,
                                    int slots, void *stream, int step)
{
    RA_CHECK(slots >= 1 && slots <= RA_EXCHANGE_SLOTS, RINGATTN_ERR_INTERNAL,
             "ringattn: all-to-all of %d arrays", slots);
    const int P = c->size, r = c->rank;
    if (c->ops->alltoall && slots == 1) return ra__comm_alltoall_op(c, send, recv);
    for (int k = 1; k < P; ++k) {
        const int to = (r + k) % P, from = (r - k + P) % P;
        ra_exchange x = {.step = step};
        for (int i = 0; i < slots; ++i) {
            x.send[i] = send[i * P + to];
            x.send[i].peer = to;
            x.recv[i] = recv[i * P + from];
            x.recv[i].peer = from;
        }
        RA_TRY(ra__comm_start(c, &x, stream));
        RA_TRY(ra__comm_wait(c, &x));
    }
    return RINGATTN_SUCCESS;
}
