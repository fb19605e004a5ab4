/*
 * ring_attention: exact sequence-parallel ("ring") attention over MPI, or over NCCL between GPUs.
 *
 *   mpirun -n 4 ring_attention [flags]                   CPU ranks, K/V over MPI
 *   mpirun -n 4 ring_attention --backend cuda [flags]    one GPU per rank, K/V over NCCL
 *                                                        (see --help, and README.md next to this file)
 *
 * Default: T = 32768 tokens as one sequence, 8 query heads on 2 kv heads (GQA), D = 128,
 * causal sliding window of 4096 tokens, layout zigzag, float32. Every rank builds the same
 * global Q, K, V and dO from one seed, keeps its own rows (ringattn_plan_scatter), and the ranks
 * run the forward and the backward together. Rank 0 prints the configuration, the ring schedule
 * (worked out here from every rank's token map and the SPEC 3 mask; RINGATTN_LOG=info, which
 * this program sets on rank 0 unless you set it, makes the library print its own), the time of
 * each pass (max and min over ranks), GFLOP/s (allowed query-key pairs only), the K/V bytes each
 * rank sent, and the error of a sample of rows per rank (all heads) of O, LSE and dQ against a
 * float64 computation done here. Every rank exits 1 when an error is above the SPEC 9
 * tolerance, 2 on a usage or API error. --digest also prints, per rank, FNV-1a 64 hashes of the
 * bytes of its O, LSE, dQ, dK and dV (tests/multinode compares runs across hosts bit for bit).
 * The helpers it shares with the other examples (float16/bfloat16 storage, random inputs, the
 * mask, the float64 reference, MPI helpers) are in ../common/example_util.h and
 * ../common/example_mpi.h.
 *
 * --backend cuda: each rank takes the GPU of its rank within its node (modulo the GPUs it sees),
 * makes the NCCL communicator from MPI_COMM_WORLD (ringattn_comm_create_nccl_mpi), copies its
 * shards to the device and runs the passes on a stream of its own; the times are to the end of
 * that stream's work, and the check reads the outputs copied back. The runtime calls are found
 * by name (../common/example_cuda.h), so this one program runs on every build.
 */
#define _GNU_SOURCE /* setenv, sysconf; RTLD_DEFAULT for example_cuda.h */
#include <mpi.h>
#include <ringattn.h>
#include <ringattn_mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/example_cuda.h"
#include "../common/example_mpi.h" /* includes example_util.h */

typedef struct {
    int64_t seq;     /* total tokens */
    int num_seqs;    /* packed sequences of (nearly) equal length */
    int heads, kv_heads, dim;
    int window;      /* > 0: causal sliding window of W tokens; 0: causal; -1: no mask */
    ringattn_layout_t layout;
    ringattn_dtype_t dtype;
    int threads;     /* per rank; 0 = choose (see threads_per_rank) */
    int sample;      /* rows checked per rank */
    uint64_t seed;
    int backward;
    int digest;      /* print hashes of every rank's outputs */
    int cuda;        /* --backend cuda: one GPU per rank, NCCL */
    int ulysses;     /* --ulysses P_u: a 2D plan, groups of P_u consecutive ranks (0: a ring) */
} options_t;

static int rank_, ranks_; /* this process's place in MPI_COMM_WORLD */

/* ---- inputs: the same on every rank (same seed) ---- */

static void *random_tensor(int64_t elems, ringattn_dtype_t dt, uint64_t *seed) {
    void *p = xmalloc((size_t)elems * dtype_size(dt));
    for (int64_t i = 0; i < elems; ++i) store(p, dt, i, (float)uniform(seed));
    return p;
}

/* the stored values as float32: the buffer itself for float32, a decoded copy otherwise */
static const float *as_float(const void *buf, int64_t elems, ringattn_dtype_t dt) {
    if (dt == RINGATTN_FLOAT32) return buf;
    float *f = xmalloc(sizeof(float) * (size_t)elems);
    for (int64_t i = 0; i < elems; ++i) f[i] = load(buf, dt, i);
    return f;
}

static void release_float(const float *f, const void *buf) {
    if ((const void *)f != buf) free((void *)f);
}

/* ---- the schedule, from every rank's token map ---- */

typedef struct {
    int P, num_steps;  /* ring steps: 1 + the farthest ring distance with an allowed pair */
    int64_t *count;    /* [P] tokens of each rank */
    int32_t **tokens;  /* [P][count] global indices, in local row order */
    int32_t **sorted;  /* [P][count] the same, sorted */
    char *meet;        /* [P * P]: does any query of rank r see any key of rank s */
} ring_map_t;

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* does the sorted key list hold an index in [lo, hi]? */
static int holds_key_in(const int32_t *keys, int64_t n, range_t r) {
    int64_t a = 0, b = n; /* first key >= lo */
    while (a < b) {
        const int64_t m = (a + b) / 2;
        if (keys[m] < r.lo) a = m + 1; else b = m;
    }
    return a < n && keys[a] <= r.hi;
}

/* Gathers every rank's tokens (collective) and works out which shards meet and the ring length. */
static void ring_map_make(ring_map_t *m, ringattn_plan_t plan, const mask_t *mask) {
    const int P = ranks_;
    int64_t mine = 0;
    ringattn_plan_local_tokens(plan, &mine, NULL);
    int32_t *local = xmalloc(sizeof(int32_t) * (size_t)mine);
    ringattn_plan_local_tokens(plan, &mine, local);
    m->P = P;
    m->count = xmalloc(sizeof(int64_t) * (size_t)P);
    MPI_Allgather(&mine, 1, MPI_INT64_T, m->count, 1, MPI_INT64_T, MPI_COMM_WORLD);
    int *counts = xmalloc(sizeof(int) * (size_t)P), *displs = xmalloc(sizeof(int) * (size_t)P);
    int32_t *all = xmalloc(sizeof(int32_t) * (size_t)mask->cu[mask->num_seqs]);
    for (int r = 0, at = 0; r < P; at += counts[r++]) counts[r] = (int)m->count[r], displs[r] = at;
    MPI_Allgatherv(local, (int)mine, MPI_INT32_T, all, counts, displs, MPI_INT32_T, MPI_COMM_WORLD);
    m->tokens = xmalloc(sizeof(int32_t *) * (size_t)P);
    m->sorted = xmalloc(sizeof(int32_t *) * (size_t)P);
    for (int r = 0; r < P; ++r) {
        m->tokens[r] = xmalloc(sizeof(int32_t) * (size_t)m->count[r]);
        m->sorted[r] = xmalloc(sizeof(int32_t) * (size_t)m->count[r]);
        memcpy(m->tokens[r], all + displs[r], sizeof(int32_t) * (size_t)m->count[r]);
        memcpy(m->sorted[r], all + displs[r], sizeof(int32_t) * (size_t)m->count[r]);
        qsort(m->sorted[r], (size_t)m->count[r], sizeof(int32_t), cmp_i32);
    }
    m->meet = calloc((size_t)P * P, 1);
    m->num_steps = 1;
    for (int r = 0; r < P; ++r)
        for (int64_t i = 0; i < m->count[r]; ++i) {
            const range_t a = allowed_keys(mask, m->tokens[r][i]);
            for (int s = 0; s < P; ++s)
                if (!m->meet[r * P + s] && a.hi >= a.lo && holds_key_in(m->sorted[s], m->count[s], a))
                    m->meet[r * P + s] = 1;
        }
    for (int r = 0; r < P; ++r) /* at step t rank r holds the K/V of rank (r - t) mod P */
        for (int t = 1; t < P; ++t)
            if (m->meet[r * P + (r - t + P) % P] && t + 1 > m->num_steps) m->num_steps = t + 1;
    free(local), free(counts), free(displs), free(all);
}

static void ring_map_free(ring_map_t *m) {
    for (int r = 0; r < m->P; ++r) free(m->tokens[r]), free(m->sorted[r]);
    free(m->tokens), free(m->sorted), free(m->count), free(m->meet);
}

/* Rank 0 prints the schedule: which steps each rank computes at (from the token maps; the
   library's plan info has their count, the ring length and the bytes each rank moves). Every
   rank's info is gathered; a disagreement with the map is reported (it would be a bug). */
static void print_schedule(const ring_map_t *m, ringattn_plan_t plan) {
    const int P = m->P, N = m->num_steps;
    ringattn_plan_info_t mine = RINGATTN_PLAN_INFO_INIT;
    ringattn_plan_get_info(plan, &mine);
    enum { V = 10 };
    const double vals[V] = {(double)mine.num_steps, (double)mine.compute_steps,
                            (double)mine.forward_bytes_sent, (double)mine.forward_bytes_received,
                            (double)mine.backward_bytes_sent, (double)mine.backward_bytes_received,
                            (double)mine.local_tokens, (double)mine.ulysses_size,
                            (double)mine.alltoall_forward_bytes_sent,
                            (double)mine.alltoall_backward_bytes_sent};
    double *all = xmalloc(sizeof(double) * V * (size_t)P);
    MPI_Gather(vals, V, MPI_DOUBLE, all, V, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank_ != 0) {
        free(all);
        return;
    }
    if (mine.ulysses_size > 1) { /* a 2D plan: the token map above is a flat ring's; the plan's
                                    info says it all */
        printf("schedule of the 2D plan (ringattn_plan_get_info): %d x %d (all-to-all inside "
               "groups of %d consecutive ranks, a ring of %d across them), %d ring steps\n",
               mine.ulysses_size, mine.ring_size, mine.ulysses_size, mine.ring_size,
               mine.num_steps);
        for (int r = 0; r < P; ++r) {
            const double *v = all + V * r;
            printf("  rank %d (group %d): %lld tokens; ring sends %.1f MB forward, %.1f MB "
                   "backward; all-to-all sends %.1f / %.1f MB\n", r, r / mine.ulysses_size,
                   (long long)v[6], v[2] * 1e-6, v[4] * 1e-6, v[8] * 1e-6, v[9] * 1e-6);
        }
        free(all);
        return;
    }
    printf("schedule (steps from the ranks' token maps and the SPEC 3 mask; bytes from "
           "ringattn_plan_get_info):\n");
    printf("  %d of %d ring steps%s\n", N, P,
           N < P ? " (the ring is cut: no rank needs a farther shard)" : "");
    for (int r = 0; r < P; ++r) {
        const double *v = all + V * r;
        char steps[256] = "";
        int kept = 0;
        for (int t = 0; t < N; ++t)
            if (t == 0 || m->meet[r * P + (r - t + P) % P]) {
                const size_t len = strlen(steps);
                snprintf(steps + len, sizeof steps - len, "%s%d", kept++ ? ", " : "", t);
            }
        printf("  rank %d: %lld tokens, computes at step(s) %s; sends %.1f MB forward, "
               "%.1f MB backward (receives %.1f / %.1f MB)\n",
               r, (long long)m->count[r], steps, v[2] * 1e-6, v[4] * 1e-6, v[3] * 1e-6,
               v[5] * 1e-6);
        if ((int)v[0] != N || (int)v[1] != kept || (int64_t)v[6] != m->count[r])
            printf("  warning: the library's plan says %d ring steps, %d computed, %lld tokens on "
                   "rank %d\n", (int)v[0], (int)v[1], (long long)v[6], r);
    }
    free(all);
}

/* ---- digest: FNV-1a 64 of each output's bytes; rank 0 prints every rank's, in rank order ---- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t bytes) {
    const unsigned char *c = p;
    for (size_t i = 0; i < bytes; ++i) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static void print_digest(const void *const bufs[5], const size_t bytes[5], int n) {
    uint64_t mine[5], *all = xmalloc(sizeof(uint64_t) * 5 * (size_t)ranks_);
    for (int i = 0; i < 5; ++i)
        mine[i] = i < n ? fnv1a(14695981039346656037ull, bufs[i], bytes[i]) : 0;
    MPI_Gather(mine, 5, MPI_UINT64_T, all, 5, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    for (int r = 0; rank_ == 0 && r < ranks_; ++r) {
        const uint64_t *h = all + 5 * r;
        printf("digest rank %d: O %016llx LSE %016llx dQ %016llx dK %016llx dV %016llx\n", r,
               (unsigned long long)h[0], (unsigned long long)h[1], (unsigned long long)h[2],
               (unsigned long long)h[3], (unsigned long long)h[4]);
    }
    free(all);
}

/* ---- checks on a sample of this rank's rows ---- */

typedef struct {
    const void *q, *dout, *o, *dq; /* local [rows, H, D] tensors, storage dtype */
    const float *lse;              /* local [H, rows] */
    int64_t rows;
    const int32_t *tokens;         /* global index of each local row */
} local_t;

/* The library's rows against float64, and a plain float32 implementation's rows against the
   same float64 reference (the yardstick of SPEC 9 for 16-bit dtypes); example_util.h has both. */
static void check_rows(const reference_inputs_t *in, const local_t *lc, const int64_t *rows,
                       int nrows, errors_t *lib, errors_t *plain) {
    const int D = in->dim, H = in->heads;
    const ringattn_dtype_t dt = in->dtype;
    double *buf = xmalloc(sizeof(double) * (size_t)D * 6);
    double *ro = buf, *rdq = buf + D, *po = buf + 2 * D, *pdq = buf + 3 * D, *lo = buf + 4 * D,
           *ldq = buf + 5 * D;
    float *qi = xmalloc(sizeof(float) * (size_t)D), *di = xmalloc(sizeof(float) * (size_t)D);
    for (int n = 0; n < nrows; ++n)
        for (int h = 0; h < H; ++h) {
            const int64_t row = rows[n], base = (row * H + h) * D;
            for (int c = 0; c < D; ++c) {
                qi[c] = load(lc->q, dt, base + c), di[c] = load(lc->dout, dt, base + c);
                lo[c] = load(lc->o, dt, base + c);
                if (lc->dq) ldq[c] = load(lc->dq, dt, base + c);
            }
            double rlse, plse;
            const float *d = lc->dq ? di : NULL;
            reference_f64(in, lc->tokens[row], h, qi, d, ro, &rlse, rdq);
            plain_f32(in, lc->tokens[row], h, qi, d, po, &plse, pdq);
            accumulate(lib, lo, ro, lc->lse[(int64_t)h * lc->rows + row], rlse,
                       lc->dq ? ldq : NULL, rdq, D);
            accumulate(plain, po, ro, plse, rlse, lc->dq ? pdq : NULL, rdq, D);
        }
    free(buf), free(qi), free(di);
}

/* ---- options ---- */

static void usage(const char *argv0) {
    printf("usage: mpirun -n P %s [--backend cpu|cuda] [--seq T] [--seqs N] [--heads H]\n"
           "          [--kv-heads HKV] [--dim D] [--window W] [--layout contiguous|zigzag|striped]\n"
           "          [--dtype f32|f16|bf16] [--threads N] [--sample ROWS] [--seed S]\n"
           "          [--ulysses P_u] (2D: all-to-all inside groups of P_u ranks, ring across)\n"
           "          [--no-backward] [--digest]\n"
           "--backend cuda: one GPU per rank (its rank within the node), K/V over NCCL\n"
           "defaults: --seq 32768 --seqs 1 --heads 8 --kv-heads 2 --dim 128 --window 4096\n"
           "          (causal sliding window; 0 = plain causal, -1 = no mask) --layout zigzag\n"
           "          --dtype f32 --threads 0 (OMP_NUM_THREADS if set, else cores / ranks on\n"
           "          the node, at least 1) --sample 16 (rows per rank)\n"
           "--digest prints hashes of every rank's O, LSE, dQ, dK, dV (bitwise comparisons)\n",
           argv0);
}

/* 1 = run, 0 = bad flags, -1 = --help; messages on rank 0 only (every rank parses the same) */
static int parse(int argc, char **argv, options_t *o) {
    *o = (options_t){32768, 1, 8, 2, 128, 4096, RINGATTN_LAYOUT_ZIGZAG, RINGATTN_FLOAT32,
                     0, 16, 1234, 1, 0, 0, 0};
    const int say = rank_ == 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-backward")) { o->backward = 0; continue; }
        if (!strcmp(a, "--digest")) { o->digest = 1; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { if (say) usage(argv[0]); return -1; }
        if (!v) { if (say) fprintf(stderr, "%s: missing value or unknown flag\n", a); return 0; }
        ++i;
        if (!strcmp(a, "--seq")) o->seq = atoll(v);
        else if (!strcmp(a, "--seqs")) o->num_seqs = atoi(v);
        else if (!strcmp(a, "--heads")) o->heads = atoi(v);
        else if (!strcmp(a, "--ulysses")) o->ulysses = atoi(v);
        else if (!strcmp(a, "--kv-heads")) o->kv_heads = atoi(v);
        else if (!strcmp(a, "--dim")) o->dim = atoi(v);
        else if (!strcmp(a, "--window")) o->window = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--sample")) o->sample = atoi(v);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--layout")) {
            if (!parse_layout(v, &o->layout)) {
                if (say) fprintf(stderr, "--layout: got %s, expected contiguous, zigzag or striped\n", v);
                return 0;
            }
        } else if (!strcmp(a, "--backend")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                if (say) fprintf(stderr, "--backend: got %s, expected cpu or cuda\n", v);
                return 0;
            }
            o->cuda = !strcmp(v, "cuda");
        } else if (!strcmp(a, "--dtype")) {
            if (!parse_dtype(v, &o->dtype)) {
                if (say) fprintf(stderr, "--dtype: got %s, expected f32, f16 or bf16\n", v);
                return 0;
            }
        } else { if (say) fprintf(stderr, "unknown flag %s (see --help)\n", a); return 0; }
    }
    if (o->seq < 1 || o->seq > INT32_MAX || o->num_seqs < 1 || o->num_seqs > o->seq ||
        o->heads < 1 || o->kv_heads < 1 || o->heads % o->kv_heads || o->dim < 1 ||
        o->window < -1 || o->sample < 1 || o->threads < 0) {
        if (say) fprintf(stderr, "invalid options (heads must be a multiple of kv-heads; see --help)\n");
        return 0;
    }
    return 1;
}

/* ---- main ---- */

typedef struct {
    void *q, *k, *v, *dout, *o, *lse, *dq, *dk, *dv; /* this rank's rows; lse: float [H, rows] */
} shard_t;

enum { NUM_PARTS = 9, FIRST_OUTPUT = 4 }; /* the parts in shard_t's order: inputs, then outputs */

static void **shard_part(shard_t *s, int i) {
    void **part[NUM_PARTS] = {&s->q, &s->k, &s->v, &s->dout, &s->o, &s->lse, &s->dq, &s->dk, &s->dv};
    return part[i];
}

/* ---- --backend cuda ---- */

static cuda_memory_t cuda_;

/* This rank's GPU: its rank within its node, modulo the GPUs it sees. Collective. */
static int pick_device(int *device) {
    int on_node = 1, count = 0;
    const int local = node_rank(&on_node);
    const int found = cuda_memory_load(&cuda_, "ring_attention") == 0 &&
                      cuda_.device_count(&count) == 0 && count > 0;
    if (!all_ok(found)) {
        if (rank_ == 0) fprintf(stderr, "--backend cuda: a rank sees no CUDA device\n");
        return 0;
    }
    *device = local % count;
    if (rank_ == 0 && on_node > count)
        printf("  note: %d ranks share %d GPU(s) on a node; NCCL refuses two ranks on one GPU "
               "(\"Duplicate GPU detected\") unless each rank sets its own NCCL_HOSTID\n",
               on_node, count);
    return 1;
}

/* Device copies of the inputs, and the outputs poisoned (NaN) as on the host; 0 on failure. */
static int shard_to_device(shard_t *host, shard_t *dev, const size_t bytes[NUM_PARTS]) {
    int ok = 1;
    for (int i = 0; i < NUM_PARTS; ++i)
        ok &= (*shard_part(dev, i) = cuda_memory_upload(&cuda_, *shard_part(host, i), bytes[i])) != NULL;
    return ok;
}

/* The outputs back to the host; 0 on failure. */
static int shard_to_host(shard_t *dev, shard_t *host, const size_t bytes[NUM_PARTS]) {
    int ok = 1;
    for (int i = FIRST_OUTPUT; i < NUM_PARTS; ++i)
        ok &= cuda_.copy(*shard_part(host, i), *shard_part(dev, i), bytes[i], 4) == 0;
    return ok;
}

static void shard_free(shard_t *s, int on_device) {
    for (int i = 0; i < NUM_PARTS; ++i)
        if (*shard_part(s, i)) on_device ? (void)cuda_.free_(*shard_part(s, i)) : free(*shard_part(s, i));
}

static int run(const options_t *opt, int threads);

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
    options_t opt;
    const int parsed = parse(argc, argv, &opt);
    int status = parsed < 0 ? 0 : 2;
    if (parsed > 0) {
        /* The library reads RINGATTN_LOG once, at its first log call: set it before any call. */
        if (rank_ == 0) setenv("RINGATTN_LOG", "info", 0);
        status = run(&opt, opt.threads ? opt.threads : threads_per_rank());
    }
    MPI_Finalize();
    return status;
}

static int run(const options_t *opt, int threads) {
    const int64_t T = opt->seq;
    const int H = opt->heads, HKV = opt->kv_heads, D = opt->dim, P = ranks_;
    const ringattn_dtype_t dt = opt->dtype;
    const size_t es = dtype_size(dt);
    int device = -1;
    if (opt->cuda && !pick_device(&device)) return 2;

    /* num_seqs sequences, the first T % num_seqs one token longer (SPEC 8 convention) */
    int32_t *cu = xmalloc(sizeof(int32_t) * (size_t)(opt->num_seqs + 1));
    split_tokens(T, opt->num_seqs, cu);
    int wl, wr;
    causal_window(opt->window, &wl, &wr);
    const mask_t mask = {cu, opt->num_seqs, wl, wr};
    if (rank_ == 0) {
        if (opt->cuda)
            printf("ringattn %s ring attention: %d rank(s) over NCCL, backend cuda, one GPU per rank\n",
                   ringattn_version_string(), P);
        else
            printf("ringattn %s ring attention: %d rank(s) over MPI, backend cpu, %d thread(s) per "
                   "rank\n", ringattn_version_string(), P, threads);
        printf("  tokens %lld in %d sequence(s), heads %d, kv heads %d, head dim %d, %s\n",
               (long long)T, opt->num_seqs, H, HKV, D, dtype_name(dt));
        printf("  mask: %s, window (%d, %d), layout %s\n", wr == 0 ? "causal" : "none", wl, wr,
               layout_name(opt->layout));
        fflush(stdout);
    }

    ringattn_comm_t comm = NULL;
    if (!api_ok(opt->cuda ? "ringattn_comm_create_nccl_mpi" : "ringattn_comm_create_mpi",
                opt->cuda ? ringattn_comm_create_nccl_mpi(MPI_COMM_WORLD, device, &comm)
                          : ringattn_comm_create_mpi(MPI_COMM_WORLD, &comm)))
        return 2;
    ringattn_plan_desc_t desc = RINGATTN_PLAN_DESC_INIT;
    desc.num_heads = H;
    desc.num_kv_heads = HKV;
    desc.head_dim = D;
    desc.dtype = dt;
    desc.layout = opt->layout;
    desc.ulysses_size = opt->ulysses; /* 0: the flat ring */
    desc.num_seqs = opt->num_seqs;
    desc.cu_seqlens = cu; /* GLOBAL boundaries: the same on every rank */
    desc.causal = wr == 0;
    desc.window_left = wl;
    desc.window_right = -1; /* causal sets it to 0 */
    desc.num_threads = threads;
    desc.backend = opt->cuda ? RINGATTN_BACKEND_CUDA : RINGATTN_BACKEND_CPU;
    desc.device = device;
    ringattn_plan_t plan = NULL;
    if (!api_ok("ringattn_plan_create", ringattn_plan_create(comm, &desc, &plan))) {
        ringattn_comm_destroy(comm);
        return 2;
    }
    ring_map_t map;
    ring_map_make(&map, plan, &mask);
    const int64_t rows = map.count[rank_];
    const double pairs = allowed_pairs(&mask) * H; /* allowed (query, key) pairs, all heads */
    if (rank_ == 0) {
        printf("  allowed pairs %.4g (%.2f%% of T^2 x heads)\n", pairs,
               100.0 * pairs / ((double)T * (double)T * H));
    }
    print_schedule(&map, plan); /* collective */
    fflush(stdout);

    /* The same global inputs on every rank (one seed); each keeps its own rows. */
    uint64_t seed = opt->seed;
    void *gq = random_tensor(T * H * D, dt, &seed), *gk = random_tensor(T * HKV * D, dt, &seed);
    void *gv = random_tensor(T * HKV * D, dt, &seed), *gdo = random_tensor(T * H * D, dt, &seed);
    const size_t qb = (size_t)(rows * H * D) * es, kb = (size_t)(rows * HKV * D) * es;
    const size_t bytes[NUM_PARTS] = {qb, kb, kb, qb, qb, sizeof(float) * (size_t)(rows * H), qb, kb, kb};
    shard_t sh, dev = {0};
    for (int i = 0; i < NUM_PARTS; ++i) *shard_part(&sh, i) = xmalloc(bytes[i]);
    for (int i = FIRST_OUTPUT; i < NUM_PARTS; ++i) memset(*shard_part(&sh, i), 0xff, bytes[i]); /* NaN */
    int ok = scatter_rows(plan, dt, H, D, gq, sh.q) && scatter_rows(plan, dt, HKV, D, gk, sh.k) &&
             scatter_rows(plan, dt, HKV, D, gv, sh.v) && scatter_rows(plan, dt, H, D, gdo, sh.dout);
    free(gq), free(gdo); /* the check reads the local Q, dO and the global K, V */
    void *stream = NULL; /* --backend cuda: this rank's stream */
    if (opt->cuda && ok) {
        ok = shard_to_device(&sh, &dev, bytes) && cuda_.stream_create(&stream) == 0;
        if (!ok) fprintf(stderr, "[rank %d] device memory or stream: failed\n", rank_);
    }
    const shard_t *on = opt->cuda ? &dev : &sh; /* where the library reads and writes */

    ringattn_tensors_t ts = RINGATTN_TENSORS_INIT;
    ts.q.data = on->q, ts.k.data = on->k, ts.v.data = on->v, ts.o.data = on->o, ts.lse = on->lse;
    ts.dout.data = on->dout, ts.dq.data = on->dq, ts.dk.data = on->dk, ts.dv.data = on->dv;
    const double fwd_flop = pairs * 4.0 * D, bwd_flop = 2.5 * fwd_flop;
    /* GFLOP/s of the whole ring on CPU ranks; TFLOP/s per GPU */
    const double unit = opt->cuda ? 1e-12 / P : 1e-9;
    const char *unit_name = opt->cuda ? "TFLOP/s per GPU" : "GFLOP/s";
    int (*sync)(void *) = opt->cuda ? cuda_.stream_sync : NULL;
    double fmax_s = 0, fmin_s = 0, bmax_s = 0, bmin_s = 0;
    ok = all_ok(ok) &&
         timed(ringattn_forward, "ringattn_forward", plan, &ts, 1, stream, sync, &fmax_s, &fmin_s);
    if (ok && rank_ == 0)
        printf("forward:  %9.1f ms (slowest rank; fastest %.1f ms)  %7.2f %s\n", 1e3 * fmax_s,
               1e3 * fmin_s, fwd_flop / fmax_s * unit, unit_name);
    if (ok && opt->backward) {
        ok = timed(ringattn_backward, "ringattn_backward", plan, &ts, 1, stream, sync, &bmax_s,
                   &bmin_s);
        if (ok && rank_ == 0)
            printf("backward: %9.1f ms (slowest rank; fastest %.1f ms)  %7.2f %s\n",
                   1e3 * bmax_s, 1e3 * bmin_s, bwd_flop / bmax_s * unit, unit_name);
    }
    if (ok && opt->cuda && !all_ok(shard_to_host(&dev, &sh, bytes))) {
        if (rank_ == 0) fprintf(stderr, "copying the outputs back failed\n");
        ok = 0;
    }
    if (ok && opt->digest) {
        const void *bufs[5] = {sh.o, sh.lse, sh.dq, sh.dk, sh.dv};
        print_digest(bufs, bytes + FIRST_OUTPUT, opt->backward ? 5 : 2); /* collective */
        fflush(stdout);
    }
    int status = 2;
    if (ok) {
        /* sample: this rank's first and last rows and random ones (all heads) */
        const int nrows = opt->sample < rows ? opt->sample : (int)rows;
        int64_t *sample = xmalloc(sizeof(int64_t) * (size_t)(nrows + 1));
        uint64_t pick = opt->seed ^ (0x51ed270b27a4f3c1ull * (uint64_t)(rank_ + 1));
        sample_rows(sample, nrows, rows, &pick);
        const double t0 = MPI_Wtime();
        const float *kf = as_float(gk, T * HKV * D, dt), *vf = as_float(gv, T * HKV * D, dt);
        const reference_inputs_t in = {H, HKV, D, dt, mask, kf, vf};
        const local_t lc = {sh.q, sh.dout, sh.o, opt->backward ? sh.dq : NULL, sh.lse, rows,
                            map.tokens[rank_]};
        errors_t lib = {0}, plain = {0};
        check_rows(&in, &lc, sample, nrows, &lib, &plain);
        release_float(kf, gk), release_float(vf, gv);
        reduce_errors(&lib), reduce_errors(&plain);
        int checked = nrows;
        MPI_Allreduce(MPI_IN_PLACE, &checked, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (rank_ == 0)
            printf("check of %d rows (up to %d per rank) x %d heads against float64 (%.1f s):\n",
                   checked, opt->sample, H, MPI_Wtime() - t0);
        /* every rank reaches the same verdict; rank 0 prints it */
        const int say = rank_ == 0;
        int good = spec9_verdict("O", rel(lib.o_err, lib.o_ref), rel(plain.o_err, plain.o_ref),
                                 1e-5, dt, say);
        good &= spec9_verdict("LSE", rel(lib.lse_err, lib.lse_ref),
                              rel(plain.lse_err, plain.lse_ref), 1e-5, dt, say);
        if (opt->backward)
            good &= spec9_verdict("dQ", rel(sqrt(lib.dq_err2), sqrt(lib.dq_ref2)),
                                  rel(sqrt(plain.dq_err2), sqrt(plain.dq_ref2)), 1e-4, dt, say);
        good = all_ok(good);
        if (rank_ == 0) printf("%s\n", good ? "ok" : "FAILED: error above the SPEC 9 tolerance");
        status = good ? 0 : 1;
        free(sample);
    }
    ring_map_free(&map);
    ringattn_plan_destroy(plan); /* synchronises the device */
    ringattn_comm_destroy(comm); /* before MPI_Finalize */
    if (stream) cuda_.stream_destroy(stream);
    if (opt->cuda) shard_free(&dev, 1);
    shard_free(&sh, 0);
    free(cu), free(gk), free(gv);
    return status;
}
