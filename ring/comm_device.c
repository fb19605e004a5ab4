/*
 * ringattn_comm_create_threads_device: the threads transport on a device backend's memory
 * (comm/threads_device.c), with the device operations of the build's device backend.
 */
#include "base/error.h"
#include "comm/comm.h"
#include "kernels/backend.h"

ringattn_status_t ringattn_comm_create_threads_device(int num_ranks, int device,
                                                      ringattn_comm_t *comms)
{
    static const char fn[] = "ringattn_comm_create_threads_device";
#ifdef RINGATTN_HAVE_CUDA
    RA_CHECK(device >= -1, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: device: got %d, expected -1 (the current device) or a device ordinal", fn,
             device);
    const ringattn_status_t st =
        ra__comm_create_threads(fn, num_ranks, ra__cuda_backend.device_ops, device, comms);
    if (st == RINGATTN_SUCCESS) ra__clear_error();
    return st;
#else
    (void)num_ranks, (void)device, (void)comms;
    return ra__fail(RINGATTN_ERR_UNSUPPORTED,
                    "%s: this build has no CUDA backend (configure with -DRINGATTN_ENABLE_CUDA=ON)",
                    fn);
#endif
}
