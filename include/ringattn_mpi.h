/* ringattn over MPI: a ringattn communicator from the caller's MPI communicator. */
#ifndef RINGATTN_MPI_H
#define RINGATTN_MPI_H

#include <mpi.h>

#include "ringattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Makes a ringattn communicator over the ranks of mpi_comm (any communicator: WORLD or a
 * sub-communicator). mpi_comm is duplicated, so ringattn's messages never match the caller's;
 * the caller may free mpi_comm afterwards. Collective over mpi_comm. MPI must be initialised
 * (with at least MPI_THREAD_FUNNELED); destroy with ringattn_comm_destroy before MPI_Finalize.
 * The duplicate returns MPI errors (MPI_ERRORS_RETURN): they become RINGATTN_ERR_COMM, never an
 * abort. Messages go as pieces of RINGATTN_MPI_CHUNK bytes (default 262144; the smallest any
 * rank asks for), so that the deadline can count time without progress.
 */
RINGATTN_API ringattn_status_t ringattn_comm_create_mpi(MPI_Comm mpi_comm, ringattn_comm_t *comm);

#ifdef __cplusplus
}
#endif

#endif
