/*
 * example_mpi.h: the MPI helpers the ring examples (ring_attention, dynamic_mask) share, on top
 * of example_util.h: xmalloc that stops every rank, the ranks agreeing on success, a timed pass,
 * the reduction of the errors over ranks, the scatter of a global input to this rank's rows, and
 * the threads per rank. Every rank of MPI_COMM_WORLD takes part in the collective ones.
 *
 * Define _POSIX_C_SOURCE 200809L (or more) before any include: threads_per_rank calls sysconf.
 */
#ifndef RINGATTN_EXAMPLE_MPI_H
#define RINGATTN_EXAMPLE_MPI_H

#include <mpi.h>
#include <ringattn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "example_util.h"

static inline int world_rank(void) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

/* example_util.h's xmalloc: out of memory on one rank stops every rank (status 2) */
static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "[rank %d] out of memory (%zu bytes)\n", world_rank(), bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

/* Any rank's failure fails every rank: the ranks agree before going on. */
static inline int all_ok(int ok) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return ok;
}

static inline int api_ok(const char *fn, ringattn_status_t st) {
    if (st != RINGATTN_SUCCESS)
        fprintf(stderr, "[rank %d] %s: %s: %s\n", world_rank(), fn, ringattn_status_string(st),
                ringattn_last_error());
    return all_ok(st == RINGATTN_SUCCESS);
}

/* Runs a pass `reps` times, every rank starting together; the best run's slowest and fastest
   rank. A device pass (stream non-NULL) is timed to its end: sync(stream) after the call. */
typedef ringattn_status_t (*pass_fn)(ringattn_plan_t, const ringattn_tensors_t *, void *);
static inline int timed(pass_fn pass, const char *fn, ringattn_plan_t plan,
                        const ringattn_tensors_t *t, int reps, void *stream,
                        int (*sync)(void *), double *max_s, double *min_s) {
    *max_s = INFINITY;
    for (int rep = 0; rep < reps; ++rep) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        ringattn_status_t st = pass(plan, t, stream);
        if (st == RINGATTN_SUCCESS && sync && sync(stream) != 0) {
            fprintf(stderr, "[rank %d] %s: the stream's synchronisation failed\n", world_rank(), fn);
            st = RINGATTN_ERR_CUDA;
        }
        const double s = MPI_Wtime() - t0;
        if (!api_ok(fn, st)) return 0;
        double hi, lo;
        MPI_Allreduce(&s, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&s, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        if (hi < *max_s) *max_s = hi, *min_s = lo;
    }
    return 1;
}

/* errors_t over every rank: the maxima with MPI_MAX, the sums of squares with MPI_SUM */
static inline void reduce_errors(errors_t *e) {
    MPI_Allreduce(MPI_IN_PLACE, e, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &e->dq_err2, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

/* This rank's rows of a global [T, heads, dim] tensor (ringattn_plan_scatter); 0 on failure
   (the message on stderr). Not collective. */
static inline int scatter_rows(ringattn_plan_t plan, ringattn_dtype_t dt, int heads, int dim,
                               void *global, void *local) {
    ringattn_tensor_t g = RINGATTN_TENSOR_NONE, l = RINGATTN_TENSOR_NONE;
    g.data = global, l.data = local;
    if (ringattn_plan_scatter(plan, dt, heads, dim, g, l) == RINGATTN_SUCCESS) return 1;
    fprintf(stderr, "[rank %d] ringattn_plan_scatter: %s\n", world_rank(), ringattn_last_error());
    return 0;
}

/* This rank's place among the ranks of its node, and their number */
static inline int node_rank(int *on_node) {
    MPI_Comm node;
    int local = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, on_node);
    MPI_Comm_free(&node);
    return local;
}

/* OMP_NUM_THREADS when set; otherwise the node's cores shared among its ranks, at least 1 */
static inline int threads_per_rank(void) {
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && atoi(env) > 0) return atoi(env);
    int local = 1;
    node_rank(&local);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > local ? (int)(cores / local) : 1;
}

#endif /* RINGATTN_EXAMPLE_MPI_H */
