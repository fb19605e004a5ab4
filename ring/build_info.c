/* ringattn_build_info: what this build of the library has (ringattn-info prints it). */
#include "ringattn.h"

const char *ringattn_build_info(void)
{
    return "backends: cpu"
#ifdef RINGATTN_HAVE_CUDA
           ", cuda"
#endif
           "; transports: threads, custom"
#ifdef RINGATTN_HAVE_CUDA
           ", threads_device"
#endif
#ifdef RINGATTN_HAVE_MPI
           ", mpi"
#endif
#ifdef RINGATTN_HAVE_NCCL
           ", nccl"
#endif
        ;
}
