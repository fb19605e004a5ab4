/*
 * The comm entry points of NCCL builds (include/ringattn_nccl.h): the NCCL transport over the
 * caller's communicator or ringattn's own, with the device backend's operations (the backend
 * registry).
 */
#include "ringattn_nccl.h"

#include "base/error.h"
#include "comm/nccl_comm.h"
#include "kernels/backends.h"

ringattn_status_t ringattn_comm_create_nccl(ncclComm_t comm, ringattn_comm_t *out)
{
    static const char fn[] = "ringattn_comm_create_nccl";
    RA_CHECK(comm != NULL && out != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: comm/out: got NULL, expected a NCCL communicator and a handle to fill", fn);
    RA_TRY(ra__comm_create_nccl(fn, comm, 0, ra__backend_device_memory(), out));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_nccl_get_unique_id(ncclUniqueId *id)
{
    static const char fn[] = "ringattn_nccl_get_unique_id";
    RA_CHECK(id != NULL, RINGATTN_ERR_INVALID_ARGUMENT, "%s: id: got NULL", fn);
    RA_TRY(ra__nccl_unique_id(fn, id));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_comm_create_nccl_id(const ncclUniqueId *id, int nranks, int rank,
                                               int device, ringattn_comm_t *out)
{
    static const char fn[] = "ringattn_comm_create_nccl_id";
    RA_CHECK(id != NULL && out != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: id/out: got NULL, expected a unique id and a handle to fill", fn);
    RA_TRY(ra__comm_create_nccl_id(fn, id, nranks, rank, device, ra__backend_device_memory(), out));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}
