/*
 * The transport registry: the one file of comm/ that knows which transports a build has (with
 * the backend registry, kernels/backends.c, the only files with build #ifdefs). A new transport
 * is its ra_comm_ops, its constructor behind an entry point in api/, and a line here.
 */
#include "comm/transports.h"

#include <string.h>

#include "base/error.h"

#ifdef RINGATTN_HAVE_CUDA /* a device backend, whose memory a device comm moves */
#define DEVICE_BUILT 1
#else
#define DEVICE_BUILT 0
#endif
#ifdef RINGATTN_HAVE_MPI
#define MPI_BUILT 1
#define MPI_FROM_FORTRAN ra__comm_create_mpi_fortran
#else
#define MPI_BUILT 0
#define MPI_FROM_FORTRAN NULL
#endif
#ifdef RINGATTN_HAVE_NCCL
#define NCCL_BUILT 1
#else
#define NCCL_BUILT 0
#endif
#if defined(RINGATTN_HAVE_NCCL) && defined(RINGATTN_HAVE_MPI)
#define NCCL_OVER_MPI ra__comm_create_nccl_over_mpi
#else
#define NCCL_OVER_MPI NULL
#endif

#define NEEDS_CUDA "configure with -DRINGATTN_ENABLE_CUDA=ON"
static const ra_transport_info transports[] = {
    {"threads", "threads", "", 1, NULL, NULL},
    {"custom", "custom", "", 1, NULL, NULL},
    {"threads_device", "device-copy threads", NEEDS_CUDA, DEVICE_BUILT, NULL, NULL},
    {"mpi", "MPI", "configure with -DRINGATTN_ENABLE_MPI=ON", MPI_BUILT, MPI_FROM_FORTRAN, NULL},
    {"nccl", "NCCL", NEEDS_CUDA " -DRINGATTN_ENABLE_NCCL=ON", NCCL_BUILT, NULL, NCCL_OVER_MPI},
    {"simulated", "simulated", "", 1, NULL, NULL}, /* plans sized without peers, no calls */
};

int ra__transport_count(void) { return (int)(sizeof transports / sizeof transports[0]); }

const ra_transport_info *ra__transport_at(int i)
{
    return i >= 0 && i < ra__transport_count() ? &transports[i] : NULL;
}

const ra_transport_info *ra__transport_find(const char *name)
{
    for (int i = 0; i < ra__transport_count(); i++)
        if (strcmp(transports[i].name, name) == 0) return &transports[i];
    return NULL;
}

ringattn_status_t ra__transport_absent(const char *fn, const char *name)
{
    const ra_transport_info *t = ra__transport_find(name);
    return ra__fail(RINGATTN_ERR_UNSUPPORTED, "%s: this build has no %s transport (%s)", fn,
                    t ? t->title : name, t ? t->needs : "no build has it");
}
