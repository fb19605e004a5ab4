/* Transport-independent comm entry points: rank/size queries and destruction. */
#include <stdlib.h>

#include "comm/comm.h"
#include "base/error.h"
#include "base/registry.h"

ringattn_status_t ringattn_comm_rank(ringattn_comm_t comm, int *rank, int *size)
{
    RA_CHECK(comm && ra__registry_contains(comm), RINGATTN_ERR_INVALID_USAGE,
             "ringattn_comm_rank: comm: got %p, expected a live communicator", (void *)comm);
    RA_CHECK(rank && size, RINGATTN_ERR_INVALID_ARGUMENT,
             "ringattn_comm_rank: rank/size: got NULL, expected pointers");
    *rank = comm->rank;
    *size = comm->size;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_comm_destroy(ringattn_comm_t comm)
{
    if (comm == NULL) return RINGATTN_SUCCESS;
    RA_CHECK(ra__registry_remove(comm), RINGATTN_ERR_INVALID_USAGE,
             "ringattn_comm_destroy: comm: got %p, expected a live communicator (destroyed "
             "twice?)",
             (void *)comm);
    comm->ops->destroy(comm);
    return RINGATTN_SUCCESS;
}

double ra__comm_timeout_s(void)
{
    const char *env = getenv("RINGATTN_COMM_TIMEOUT");
    return env && atof(env) > 0 ? atof(env) : 60.0;
}

int ra__comm_next_tag(ringattn_comm_t c)
{
    enum { PERIOD = 32767 / RA_EXCHANGE_SLOTS }; /* exchanges in flight are far fewer */
    return (int)(c->exchanges++ % PERIOD) * RA_EXCHANGE_SLOTS;
}
