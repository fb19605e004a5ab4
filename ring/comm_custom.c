/*
 * ringattn_comm_create_custom (include/ringattn_transport.h): the caller's transport table,
 * checked here before comm/custom.c copies it.
 */
#include "ringattn_transport.h"

#include "base/error.h"
#include "comm/comm.h"

/* The first required callback left NULL, or NULL when all are set (release is optional). */
static const char *missing_callback(const ringattn_transport_t *t)
{
    return !t->sendrecv_start ? "sendrecv_start"
           : !t->test         ? "test"
           : !t->wait         ? "wait"
           : !t->allreduce    ? "allreduce"
                              : NULL;
}

ringattn_status_t ringattn_comm_create_custom(const ringattn_transport_t *transport, int rank,
                                              int size, ringattn_comm_t *comm)
{
    static const char fn[] = "ringattn_comm_create_custom";
    RA_CHECK(transport != NULL && comm != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: transport/comm: got NULL, expected a transport table and a handle to fill", fn);
    /* the size first: a struct of another size may end before the callbacks */
    RA_CHECK(transport->struct_size == sizeof(ringattn_transport_t), RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: transport->struct_size: got %zu, expected %zu (sizeof(ringattn_transport_t), "
             "as RINGATTN_TRANSPORT_INIT sets it)",
             fn, transport->struct_size, sizeof(ringattn_transport_t));
    const char *missing = missing_callback(transport);
    RA_CHECK(missing == NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: transport->%s: got NULL, expected a callback (only release may be NULL)", fn,
             missing);
    RA_CHECK(size >= 1, RINGATTN_ERR_INVALID_ARGUMENT, "%s: size: got %d, expected >= 1", fn,
             size);
    RA_CHECK(rank >= 0 && rank < size, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: rank: got %d, expected 0 <= rank < size (%d)", fn, rank, size);
    RA_TRY(ra__comm_create_custom(fn, transport, rank, size, comm));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}
