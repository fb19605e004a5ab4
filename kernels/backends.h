/*
 * The backend registry (kernels/backends.c): the backends this build has. The plan, the build
 * info and the API find a backend only here, never by name, and only the registry knows which
 * backends were built (docs/DESIGN.md, the floors). Internal.
 */
#ifndef RINGATTN_KERNELS_BACKENDS_H
#define RINGATTN_KERNELS_BACKENDS_H

#include "kernels/backend.h"

/* The backend of that kind in this build; NULL when the build has none (or kind is AUTO). */
const struct ra_backend *ra__backend_find(ringattn_backend_t kind);
/* The i-th backend this build has (0 <= i < ra__backend_count()), the CPU first. */
int ra__backend_count(void);
const struct ra_backend *ra__backend_at(int i);
/* What a build needs for a backend of that kind, for the message that refuses it
   ("configure with -DRINGATTN_ENABLE_CUDA=ON"). */
const char *ra__backend_needs(ringattn_backend_t kind);
/* The memory table of the build's device backend (device comms move its memory); NULL in
   a build without one. */
const struct ra_memory_ops *ra__backend_device_memory(void);
/* What the CPU kernels run on, one line (ringattn_cpu_kernels; kernels/cpu/isa.c). */
const char *ra__cpu_kernels(void);

#endif
