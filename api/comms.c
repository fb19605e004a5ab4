/*
 * The comm entry points of every build (ringattn.h, ringattn_transport.h): they check the
 * caller's arguments, take what a transport needs of the build from the registries (a device
 * backend's operations: kernels/backends.c; the transports built: comm/transports.c) and call
 * the transport's constructor in comm/.
 */
#include "ringattn_transport.h"

#include "base/abi.h"
#include "base/error.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "comm/simulated.h"
#include "comm/transports.h"
#include "kernels/backends.h"

ringattn_status_t ringattn_comm_create_threads(int num_ranks, ringattn_comm_t *comms)
{
    return ra__comm_create_threads("ringattn_comm_create_threads", num_ranks, NULL, -1, comms);
}

ringattn_status_t ringattn_comm_create_threads_device(int num_ranks, int device,
                                                      ringattn_comm_t *comms)
{
    static const char fn[] = "ringattn_comm_create_threads_device";
    const struct ra_memory_ops *dev = ra__backend_device_memory();
    if (!dev) return ra__transport_absent(fn, "threads_device");
    RA_CHECK(device >= -1, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: device: got %d, expected -1 (the current device) or a device ordinal", fn,
             device);
    const ringattn_status_t st = ra__comm_create_threads(fn, num_ranks, dev, device, comms);
    if (st == RINGATTN_SUCCESS) ra__clear_error();
    return st;
}

ringattn_status_t ringattn_comm_create_mpi_fortran(int64_t fortran_comm, ringattn_comm_t *comm)
{
    static const char fn[] = "ringattn_comm_create_mpi_fortran";
    const ra_transport_info *mpi = ra__transport_find("mpi");
    if (!mpi->from_fortran) return ra__transport_absent(fn, "mpi");
    return mpi->from_fortran(fn, fortran_comm, comm);
}

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
    /* the size first (base/abi.c's release policy): a struct of another size may end before
       the callbacks */
    ringattn_transport_t table;
    RA_TRY(ra__transport_in(fn, transport, &table));
    const char *missing = missing_callback(&table);
    RA_CHECK(missing == NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: transport->%s: got NULL, expected a callback (only release may be NULL)", fn,
             missing);
    RA_CHECK(size >= 1, RINGATTN_ERR_INVALID_ARGUMENT, "%s: size: got %d, expected >= 1", fn,
             size);
    RA_CHECK(rank >= 0 && rank < size, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: rank: got %d, expected 0 <= rank < size (%d)", fn, rank, size);
    RA_TRY(ra__comm_create_custom(fn, &table, rank, size, comm));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_comm_create_simulated(int rank, int size, ringattn_comm_t *comm)
{
    static const char fn[] = "ringattn_comm_create_simulated";
    RA_CHECK(comm != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: comm: got NULL, expected a handle to fill", fn);
    RA_CHECK(size >= 1, RINGATTN_ERR_INVALID_ARGUMENT, "%s: size: got %d, expected >= 1", fn,
             size);
    RA_CHECK(rank >= 0 && rank < size, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: rank: got %d, expected 0 <= rank < size (%d)", fn, rank, size);
    RA_TRY(ra__comm_create_simulated(fn, rank, size, comm));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_comm_rank(ringattn_comm_t comm, int *rank, int *size)
{
    RA_CHECK(comm && ra__registry_contains(comm), RINGATTN_ERR_INVALID_USAGE,
             "ringattn_comm_rank: comm: got %p, expected a live communicator", (void *)comm);
    RA_CHECK(rank && size, RINGATTN_ERR_INVALID_ARGUMENT,
             "ringattn_comm_rank: rank/size: got NULL, expected pointers");
    *rank = comm->rank;
    *size = comm->size;
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_comm_destroy(ringattn_comm_t comm)
{
    if (comm == NULL) return RINGATTN_SUCCESS;
    RA_CHECK(ra__comm_destroy(comm), RINGATTN_ERR_INVALID_USAGE,
             "ringattn_comm_destroy: comm: got %p, expected a live communicator (destroyed "
             "twice?)",
             (void *)comm);
    ra__clear_error();
    return RINGATTN_SUCCESS;
}
