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

/*
 * Makes a ringattn communicator over NCCL (include/ringattn_nccl.h) for the ranks of mpi_comm,
 * one GPU per rank: rank 0's ncclGetUniqueId is broadcast over mpi_comm, then every rank calls
 * ringattn_comm_create_nccl_id with its MPI rank on `device` (-1: the current device; a usual
 * choice is the rank within its node, MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)). ringattn owns
 * the NCCL communicator: it is destroyed with the comm, aborted when the transport fails. MPI is
 * used only here (blocking collectives on mpi_comm, which every rank must call); the plans run
 * on the CUDA backend. The same status on every rank: one rank's bad device or failed join fails
 * every rank. RINGATTN_ERR_UNSUPPORTED in builds without NCCL.
 */
RINGATTN_API ringattn_status_t ringattn_comm_create_nccl_mpi(MPI_Comm mpi_comm, int device,
                                                             ringattn_comm_t *comm);

#ifdef __cplusplus
}
#endif

#endif
