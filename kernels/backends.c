/*
 * The backend registry: the one file that knows which backends a build has (with the transport
 * registry, comm/transports.c, the only files with build #ifdefs). A new backend is its table
 * (struct ra_backend) and a line here.
 */
#include "kernels/backends.h"

#include <stddef.h>

static const struct ra_backend *const built[] = {
    &ra__cpu_backend,
#ifdef RINGATTN_HAVE_CUDA
    &ra__cuda_backend,
#endif
};

int ra__backend_count(void) { return (int)(sizeof built / sizeof built[0]); }

const struct ra_backend *ra__backend_at(int i)
{
    return i >= 0 && i < ra__backend_count() ? built[i] : NULL;
}

const struct ra_backend *ra__backend_find(ringattn_backend_t kind)
{
    for (int i = 0; i < ra__backend_count(); i++)
        if (built[i]->kind == kind) return built[i];
    return NULL;
}

const char *ra__backend_needs(ringattn_backend_t kind)
{
    return kind == RINGATTN_BACKEND_CUDA ? "configure with -DRINGATTN_ENABLE_CUDA=ON"
                                         : "a build of this library";
}

const struct ra_memory_ops *ra__backend_device_memory(void)
{
    for (int i = 0; i < ra__backend_count(); i++)
        if (ra__memory_on_device(built[i]->memory)) return built[i]->memory;
    return NULL;
}
