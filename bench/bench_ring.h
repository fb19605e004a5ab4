/*
 * bench_ring.h: what the files of bench_ring share (see bench_ring.c for what it measures):
 *   bench_ring.c          problems, the single-rank reference, the rings over MPI and over
 *                         threads, the checks, the results table and main;
 *   bench_ring_options.c  the flags and their defaults;
 *   bench_ring_traffic.c  every rank's token map, the traffic lower bound and its table;
 *   bench_ring_overlap.c  the PMPI wrappers timing the MPI calls, the timed ring pass, the
 *                         exchange alone and the overlap table.
 *   bench_ring_ulysses.c  --ulysses: 2D plans on ranks as threads, with tools/link_model.c.
 */
#ifndef RINGATTN_BENCH_RING_H
#define RINGATTN_BENCH_RING_H

#include <mpi.h>
#include <ringattn.h>

#include <stdint.h>
#include <stdio.h>

#define BENCH_NAME "bench_ring"
#define BENCH_MPI /* out of memory stops every rank */
#include "common.h"

/* The executable exports its symbols so that the library binds to the PMPI wrappers
   (bench/CMakeLists.txt); everything declared here stays inside it. */
#pragma GCC visibility push(hidden)

enum { NUM_LAYOUTS = 3 };
extern const char *const layout_names[NUM_LAYOUTS];

extern int rank_, ranks_;
extern int failures; /* wrong or failed results (rank 0's count is the verdict) */
extern FILE *json;   /* rank 0: JSON lines, printed after the tables unless --json FILE */

/* ---------------------------------------------------------------- problems and runs */

/* one problem: tokens (one sequence), heads, kv heads, head dim, mask */
typedef struct {
    int T, H, HKV, D;
    int window; /* > 0: causal sliding window of W tokens; 0: causal; -1: no mask */
} shape_t;

/* its inputs */
typedef struct {
    shape_t s;
    int32_t cu[2];
    float *q, *k, *v, *dout; /* global, the same on every rank (one seed) */
} problem_t;

/* one rank's rows of the inputs and outputs of a run */
typedef struct {
    int64_t rows;
    int32_t *tokens; /* global index of each row */
    float *q, *k, *v, *dout, *o, *lse, *dq, *dk, *dv;
} outputs_t;

/* the rows every result is checked on */
typedef struct {
    int nrows;
    int32_t *rows; /* sampled global rows: first, last, random */
} sample_t;

/* the single-rank plan (comm = NULL) on rank 0: the reference of every ring */
typedef struct {
    outputs_t out; /* global outputs (rank 0) */
    double fwd_s, bwd_s;
    double err_fwd, err_bwd; /* against float64 on the sample */
    int ok;
} single_t;


/* every rank's token map and what the mask needs of the ring (bench_ring_traffic.c) */
typedef struct {
    int P, N;          /* ranks; ring steps the mask needs (1 + the longest journey) */
    int64_t *count;    /* [P] tokens per rank */
    int32_t **tokens;  /* [P][count] global indices in local row order */
    char *meet;        /* [P * P] rank r's queries have an allowed pair with shard s */
    int *last_hop;     /* [P] how far shard s must travel along the ring */
    int *needers;      /* [P] OTHER ranks with an allowed pair with shard s */
} ring_map_t;

/* one ring configuration: its map, the library's infos, times and errors */
typedef struct {
    int layout, P, timed, threads_transport;
    ring_map_t map;
    ringattn_plan_info_t *info;   /* [P] the library's own schedule and traffic */
    double fwd_s, bwd_s;          /* slowest rank (best of reps) */
    double mpi_fwd_s, mpi_bwd_s;  /* MPI rings: time inside MPI calls, slowest rank */
    double mpi_max_s[2];          /* the longest single MPI call, fwd / bwd, any rank */
    long mpi_calls[2];            /* MPI calls of the slowest rank, fwd / bwd */
    double copy_fwd_s, copy_bwd_s; /* threads rings: time of the in-process copies, slowest rank */
    double err_fwd, err_bwd;
    int ok;
} ring_t;

/* the exchange alone (bench_ring_overlap.c) */
typedef struct {
    double fwd_s, bwd_s;   /* slowest rank */
    double bytes[2][2];    /* this rank's [fwd, bwd][sent, received] */
} exch_t;

/* overlap of one shape: the MPI ring, the same over threads (compute), the exchange alone */
typedef struct {
    shape_t s;
    const ring_t *mpi, *threads;
    exch_t ex;
} overlap_t;

/* ---------------------------------------------------------------- options (bench_ring_options.c) */

typedef struct {
    shape_t main;              /* efficiency: causal at this shape, every layout in layouts */
    int layouts[NUM_LAYOUTS], nlayouts;
    int threads;               /* per rank; 0 = the node's cores divided among its ranks */
    int reps, sample;
    shape_t win;               /* traffic only: window narrower than a shard ... */
    int win_ranks;             /* ... on this many ranks; 0 = skip */
    int overlap;               /* compute-only and exchange-only times for zigzag */
    shape_t heavy;             /* overlap: an exchange-heavy shape (MHA, narrow window); T 0 = skip */
    const char *json_path;
    int no_json;
    shape_t decode;            /* decode: heads, kv heads, D (T, window unused) ... */
    int64_t decode_cache[8];   /* ... cache sizes (ndecode of them; 0 = skip) ... */
    int ndecode, decode_steps; /* ... and timed calls at each (cache, P) */
} options_t;

/* 1 = run, 0 = bad flags (said on rank 0), -1 = --help (printed on rank 0) */
int parse_options(int argc, char **argv, options_t *o);
int threads_per_rank(void); /* the node's cores divided among its ranks, at least 1 (collective) */

/* ---------------------------------------------------------------- bench_ring.c */

int all_ok(int ok);                                /* the minimum over ranks (collective) */
int api_ok(const char *fn, ringattn_status_t st);  /* 1 on success; the message on failure */
void mask_name(const shape_t *s, char *buf, size_t n);                  /* "causal", "win1024" */
void key_range(const shape_t *s, int64_t i, int64_t *lo, int64_t *hi); /* allowed keys of i */

/* ---------------------------------------------------------------- bench_ring_traffic.c */

/* the map from every rank's tokens (count, tokens: [P] arrays the map takes over) */
void map_build(ring_map_t *m, const shape_t *s, int P, int64_t *count, int32_t **tokens);
void map_free(ring_map_t *m);
double kv_bytes(const shape_t *s, const ring_map_t *m, int sh); /* of shard sh, float32 K and V */
/* every rank's token map into r->map (all ranks) and plan infos into r->info (rank 0); collective */
void gather_maps(const shape_t *s, const outputs_t *x, ringattn_plan_t plan, ring_t *r);
void remember_traffic(const shape_t *s, ring_t *r); /* for print_traffic (rank 0) */
void print_traffic(void);
void print_traffic_figures(void); /* the tracked figures' traffic lines */

/* ---------------------------------------------------------------- bench_ring_decode.c */

/* decode against a sharded KV cache at every cache size and P = 1 .. ranks (collective) */
void run_decode(const options_t *o, int threads);

/* ---------------------------------------------------------------- bench_ring_overlap.c */

/* forward (bwd 0) or backward over MPI, best of reps: times into r, with the time inside MPI */
int timed_pass(ringattn_plan_t plan, const ringattn_tensors_t *t, int bwd, int reps, ring_t *r);
void run_exchange(const shape_t *s, const ring_map_t *m, int reps, exch_t *x); /* collective */
void print_overlap(const overlap_t *ov, int n);
void print_overlap_figures(const overlap_t *ov, int n); /* the tracked figures' overlap lines */

#pragma GCC visibility pop

/* bench_ring_cuda.c: the CUDA ring on one device (bench_ring --backend cuda, bench_ring_cuda). */
int bench_ring_cuda(int argc, char **argv);
/* bench_ring_ulysses.c: 2D plans on P CPU ranks as threads (bench_ring --ulysses LIST). */
int bench_ring_ulysses(int argc, char **argv);

#endif /* RINGATTN_BENCH_RING_H */
