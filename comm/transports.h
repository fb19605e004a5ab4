/*
 * The transport registry (comm/transports.c): the transports this build has, and the
 * constructors behind entry points that every build has but only some builds can serve. The
 * build info and the API's entry points find them here (docs/DESIGN.md, the floors). Internal.
 */
#ifndef RINGATTN_COMM_TRANSPORTS_H
#define RINGATTN_COMM_TRANSPORTS_H

#include <stdint.h>

#include "ringattn.h"

struct ra_memory_ops;

typedef struct ra_transport_info {
    const char *name;  /* as ringattn_build_info lists it */
    const char *title; /* as messages name it */
    const char *needs; /* what a build needs for it, for the message that refuses it */
    int built;
    /* The MPI transport from a Fortran handle (ringattn.h; comm/mpi_fortran.c). */
    ringattn_status_t (*from_fortran)(const char *fn, int64_t fortran_comm, ringattn_comm_t *comm);
    /* NCCL over the ranks of an MPI communicator (ringattn_mpi.h; comm/nccl_mpi.c): mpi_comm
       points to an MPI_Comm, so that this header needs no mpi.h. */
    ringattn_status_t (*over_mpi)(const char *fn, const void *mpi_comm, int device,
                                  const struct ra_memory_ops *dev, ringattn_comm_t *out);
} ra_transport_info;

int ra__transport_count(void);
const ra_transport_info *ra__transport_at(int i);
/* The registry's entry of that name (every transport has one, built or not); NULL: no such name. */
const ra_transport_info *ra__transport_find(const char *name);
/* RINGATTN_ERR_UNSUPPORTED: "fn: this build has no <name> transport (<needs>)". */
ringattn_status_t ra__transport_absent(const char *fn, const char *name);

/* The constructors the registry names, defined only in the builds that have them. */
ringattn_status_t ra__comm_create_mpi_fortran(const char *fn, int64_t fortran_comm,
                                              ringattn_comm_t *comm);
ringattn_status_t ra__comm_create_nccl_over_mpi(const char *fn, const void *mpi_comm, int device,
                                                const struct ra_memory_ops *dev,
                                                ringattn_comm_t *out);

#endif
