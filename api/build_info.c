/* ringattn_build_info: what this build of the library has, from the backend and transport
   registries (ringattn-info prints it). */
#include <pthread.h>
#include <stdio.h>

#include "comm/transports.h"
#include "kernels/backends.h"

static char text[256];

/* "backends: cpu[, cuda]; transports: threads, custom[, threads_device][, mpi][, nccl], simulated" */
static void compose(void)
{
    size_t at = 0;
    at += (size_t)snprintf(text + at, sizeof text - at, "backends:");
    for (int i = 0; i < ra__backend_count() && at < sizeof text; i++)
        at += (size_t)snprintf(text + at, sizeof text - at, "%s %s", i ? "," : "",
                               ra__backend_at(i)->name);
    at += (size_t)snprintf(text + at, sizeof text - at, "; transports:");
    for (int i = 0, listed = 0; i < ra__transport_count() && at < sizeof text; i++) {
        const ra_transport_info *t = ra__transport_at(i);
        if (!t->built) continue;
        at += (size_t)snprintf(text + at, sizeof text - at, "%s %s", listed++ ? "," : "",
                               t->name);
    }
}

const char *ringattn_build_info(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, compose);
    return text;
}
