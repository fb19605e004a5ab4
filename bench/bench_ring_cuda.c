/*
 * bench_ring_cuda: the ring on the CUDA backend with P ranks as threads of one process, against
 * the single-rank plan in the same run. Two transports:
 *   device (default)  ringattn_comm_create_threads_device: every rank on one device, the shards
 *                     as device-to-device copies (how the multi-rank ring is measured on one GPU);
 *   nccl              ringattn_comm_create_nccl_id: rank i on device i modulo the devices (one
 *                     GPU per rank on a multi-GPU node). NCCL refuses two ranks of one process on
 *                     one GPU: with fewer GPUs than ranks the row says "skipped" and why (P
 *                     processes on one GPU are bench/gpu/check.sh's NCCL stage).
 *
 *   bench_ring_cuda [--seq T] [--heads H] [--kv-heads HK] [--dim D] [--mask causal|none]
 *                   [--dtype bf16|f32] [--ranks LIST] [--layouts LIST] [--transport device|nccl]
 *                   [--reps N]
 *   bench_ring --backend cuda [the same flags]      (the same, in builds with MPI)
 *
 * For each pass (forward, backward) and each (layout, P): time_ms is the best of N runs, from a
 * barrier of every rank to the last rank's stream synchronisation; TFLOP/s counts the allowed
 * pairs of the whole problem (FlashAttention's 4 D and 10 D flop per pair and head, D_v = D);
 * gpus is the devices the ranks ran on and eff = single-rank time / (gpus x ring time): 1.0
 * means the ring costs nothing over one rank's kernels for the same work per device (its
 * exchanges, its smaller launches and its merges). exch_ms is the ring's exchanges alone: over
 * threads-device, the most bytes a rank receives per call (ringattn_plan_get_info) at the
 * device-to-device bandwidth measured now; over NCCL, those bytes in the ring's steps through
 * ncclSend/ncclRecv on a communicator of the benchmark's own, timed. hidden is the part of that
 * the ring hid behind compute, (single / gpus + exch - time) / exch in [0, 1]; bytes_lb is the
 * bytes all ranks received against the mask's lower bound (each shard's K/V once to every other
 * rank that needs it; in the backward, its float32 dK/dV sums back from each).
 * Each ring's O (forward), dQ and dK (backward) of sampled rows are compared with the single-rank
 * plan's (normwise relative; float32 1e-5 / 1e-4, bfloat16 1e-2 / 2e-2): wrong = 1 above, and
 * any wrong result makes the exit status 1. Against the emulated library (build/emu) it proves
 * the path in CI at tiny sizes, not the speed.
 */
#define _GNU_SOURCE
#include <ringattn.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "bench_ring_cuda"
#include "common.h"
#include "../examples/common/example_cuda.h"
#include "nccl_by_name.h"

typedef struct {
    int T, H, HKV, D, causal, bf16, reps, nranks, ranks[8], nlayouts, layouts[3];
    int nccl; /* --transport nccl */
} options_t;

static cuda_memory_t cuda;
static nccl_t nccl;
static int failures;

/* The problem, host side, in the plan's dtype: [T, H, D] rows (K, V: [T, HKV, D]). */
typedef struct {
    size_t elem;
    unsigned char *q, *k, *v, *dout;
} problem_t;

static void to_dtype(const float *x, int64_t n, int bf16, unsigned char *out) {
    for (int64_t i = 0; i < n; ++i) {
        if (!bf16) {
            memcpy(out + 4 * i, &x[i], 4);
            continue;
        }
        const uint16_t h = half_from_float(x[i], RINGATTN_BFLOAT16);
        memcpy(out + 2 * i, &h, 2);
    }
}

static float from_dtype(const unsigned char *p, int64_t i, int bf16) {
    float f;
    if (!bf16) {
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return float_from_half(h, RINGATTN_BFLOAT16);
}

static unsigned char *random_rows(int64_t n, int bf16, uint64_t *seed) {
    float *f = random_floats(n, seed);
    unsigned char *out = xmalloc((size_t)n * (bf16 ? 2 : 4));
    to_dtype(f, n, bf16, out);
    free(f);
    return out;
}

/* One rank's (or the single plan's) device tensors and its host copies of O and dQ. */
typedef struct {
    void *d[9]; /* q k v o lse dout dq dk dv */
    ringattn_tensors_t t;
    unsigned char *o, *dq, *dk;
    int32_t *idx;
    int64_t rows;
} rank_io_t;

static void *upload_rows(const unsigned char *src, const int32_t *idx, int64_t rows, size_t width) {
    unsigned char *tmp = xmalloc(rows * width + 1);
    for (int64_t r = 0; r < rows; ++r) memcpy(tmp + r * width, src + (size_t)idx[r] * width, width);
    void *d = cuda_memory_upload(&cuda, tmp, rows * width);
    free(tmp);
    return d;
}

static int io_make(ringattn_plan_t plan, const options_t *o, const problem_t *p, rank_io_t *x) {
    ringattn_plan_local_tokens(plan, &x->rows, NULL);
    x->idx = xmalloc(sizeof(int32_t) * (size_t)(x->rows + 1));
    ringattn_plan_local_tokens(plan, &x->rows, x->idx);
    const size_t qw = p->elem * o->H * o->D, kw = p->elem * o->HKV * o->D;
    const int64_t n = x->rows;
    x->d[0] = upload_rows(p->q, x->idx, n, qw), x->d[1] = upload_rows(p->k, x->idx, n, kw);
    x->d[2] = upload_rows(p->v, x->idx, n, kw), x->d[5] = upload_rows(p->dout, x->idx, n, qw);
    x->d[3] = cuda_memory_upload(&cuda, NULL, n * qw), x->d[6] = cuda_memory_upload(&cuda, NULL, n * qw);
    x->d[4] = cuda_memory_upload(&cuda, NULL, sizeof(float) * n * o->H);
    x->d[7] = cuda_memory_upload(&cuda, NULL, n * kw), x->d[8] = cuda_memory_upload(&cuda, NULL, n * kw);
    x->t = (ringattn_tensors_t)RINGATTN_TENSORS_INIT;
    x->t.q.data = x->d[0], x->t.k.data = x->d[1], x->t.v.data = x->d[2], x->t.o.data = x->d[3];
    x->t.lse = x->d[4], x->t.dout.data = x->d[5];
    x->t.dq.data = x->d[6], x->t.dk.data = x->d[7], x->t.dv.data = x->d[8];
    x->o = xmalloc(n * qw + 1), x->dq = xmalloc(n * qw + 1), x->dk = xmalloc(n * kw + 1);
    for (int i = 0; i < 9; ++i)
        if (!x->d[i]) return 1;
    return 0;
}

/* O, dQ and dK back to the host (after the timed passes: the last forward's and backward's). */
static int io_download(const options_t *o, const problem_t *p, rank_io_t *x) {
    const size_t q = p->elem * o->H * o->D * (size_t)x->rows, k = q / o->H * o->HKV;
    return cuda.copy(x->o, x->d[3], q, 4) != 0 || cuda.copy(x->dq, x->d[6], q, 4) != 0 ||
           cuda.copy(x->dk, x->d[7], k, 4) != 0;
}

static void io_free(rank_io_t *x) {
    for (int i = 0; i < 9; ++i)
        if (x->d[i]) cuda.free_(x->d[i]);
    free(x->o), free(x->dq), free(x->dk), free(x->idx);
}

static ringattn_plan_desc_t desc_of(const options_t *o, const int32_t cu[2], int layout, int device) {
    ringattn_plan_desc_t d = one_sequence_desc(cu, o->H, o->HKV, o->D, 0);
    d.backend = RINGATTN_BACKEND_CUDA;
    d.device = device;
    d.dtype = o->bf16 ? RINGATTN_BFLOAT16 : RINGATTN_FLOAT32;
    d.causal = o->causal;
    d.layout = (ringattn_layout_t)layout;
    return d;
}

/* ---------------------------------------------------------------- the ring's ranks */

typedef struct {
    const options_t *o;
    const problem_t *p;
    ringattn_comm_t comm;
    int layout, rank, P, device; /* device: -1, or its own with --transport nccl */
    const nccl_id_t *ids;        /* --transport nccl: the ring's comm, the exchange alone's */
    pthread_barrier_t *bar;
    rank_io_t io;
    double best[2];        /* rank 0: best ring time per pass */
    double exch[2];        /* rank 0, --transport nccl: the exchange alone per pass */
    size_t recv_bytes[2]; /* per call and pass: what this rank receives */
    int steps;             /* ring steps (the same in both passes) */
    int failed;
    char skip[320];        /* NCCL refused the ranks (one GPU for several): why */
} rank_t;

static int call(ringattn_plan_t plan, rank_io_t *x, int bwd, void *stream) {
    const ringattn_status_t st =
        bwd ? ringattn_backward(plan, &x->t, stream) : ringattn_forward(plan, &x->t, stream);
    if (st != RINGATTN_SUCCESS) {
        fprintf(stderr, BENCH_NAME ": %s: %s\n", bwd ? "backward" : "forward", ringattn_last_error());
        return 1;
    }
    return cuda.stream_sync(stream) != 0;
}

/* Runs the passes reps times on plan (a ring rank, or the single plan when bar is NULL); the
   best times into best[] (measured by the first rank). */
static int timed_passes(ringattn_plan_t plan, rank_io_t *x, const options_t *o,
                        pthread_barrier_t *bar, int first, double best[2]) {
    void *stream = NULL;
    if (cuda.stream_create(&stream) != 0) return 1;
    int bad = 0;
    for (int bwd = 0; bwd < 2; ++bwd) {
        best[bwd] = INFINITY;
        for (int rep = 0; rep <= o->reps; ++rep) { /* rep 0: warm-up */
            if (bar) pthread_barrier_wait(bar);
            const double t0 = now();
            bad |= call(plan, x, bwd, stream);
            if (bar) pthread_barrier_wait(bar);
            if (first && rep > 0 && now() - t0 < best[bwd]) best[bwd] = now() - t0;
        }
    }
    cuda.stream_destroy(stream);
    return bad;
}

/* --transport nccl: the ring's exchanges alone (the bytes this rank receives per call, in its
   steps, from rank - 1 to rank + 1 as the ring's shards go) on a raw NCCL communicator; the
   best of reps per pass, timed by rank 0 between barriers. */
static int exchange_alone(rank_t *r) {
    void *nc = NULL, *stream = NULL, *a = NULL, *b = NULL;
    const size_t most = r->recv_bytes[0] > r->recv_bytes[1] ? r->recv_bytes[0] : r->recv_bytes[1];
    int bad = nccl.init_rank(&nc, r->P, r->ids[1], r->rank) != 0 || cuda.stream_create(&stream) != 0 ||
              !(a = cuda_memory_upload(&cuda, NULL, most)) || !(b = cuda_memory_upload(&cuda, NULL, most));
    for (int bwd = 0; bwd < 2; ++bwd) {
        const int hops = r->steps - 1;
        const size_t per = hops > 0 ? r->recv_bytes[bwd] / (size_t)hops : 0;
        r->exch[bwd] = INFINITY;
        for (int rep = 0; rep <= r->o->reps; ++rep) {
            pthread_barrier_wait(r->bar);
            const double t0 = now();
            for (int h = 0; !bad && h < hops; ++h) {
                nccl.group_start();
                nccl.send(a, per, NCCL_INT8, (r->rank + 1) % r->P, nc, stream);
                nccl.recv(b, per, NCCL_INT8, (r->rank + r->P - 1) % r->P, nc, stream);
                bad |= nccl.group_end() != 0;
            }
            bad |= cuda.stream_sync(stream) != 0;
            pthread_barrier_wait(r->bar);
            if (r->rank == 0 && rep > 0 && now() - t0 < r->exch[bwd]) r->exch[bwd] = now() - t0;
        }
    }
    if (a) cuda.free_(a);
    if (b) cuda.free_(b);
    if (stream) cuda.stream_destroy(stream);
    if (nc) nccl.destroy(nc);
    return bad;
}

static void *rank_main(void *arg) {
    rank_t *r = arg;
    if (r->o->nccl) { /* every rank's thread joins the communicator: collective */
        cuda.set_device(r->device);
        if (nccl.create_comm(&r->ids[0], r->P, r->rank, r->device, &r->comm) != RINGATTN_SUCCESS) {
            snprintf(r->skip, sizeof r->skip, "%s", ringattn_last_error());
            r->failed = !strstr(r->skip, "Duplicate GPU");
            if (r->failed) fprintf(stderr, BENCH_NAME ": comm: %s\n", r->skip), r->skip[0] = 0;
            return NULL;
        }
    }
    const int32_t cu[2] = {0, r->o->T};
    const ringattn_plan_desc_t d = desc_of(r->o, cu, r->layout, r->device);
    ringattn_plan_t plan = NULL;
    if (ringattn_plan_create(r->comm, &d, &plan) != RINGATTN_SUCCESS) {
        fprintf(stderr, BENCH_NAME ": plan: %s\n", ringattn_last_error());
        r->failed = 1;
        return NULL;
    }
    int rank = 0, size = 1;
    ringattn_comm_rank(r->comm, &rank, &size);
    ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
    if (ringattn_plan_get_info(plan, &info) == RINGATTN_SUCCESS) {
        r->recv_bytes[0] = info.forward_bytes_received, r->recv_bytes[1] = info.backward_bytes_received;
        r->steps = info.num_steps;
    }
    r->failed = io_make(plan, r->o, r->p, &r->io) ||
                timed_passes(plan, &r->io, r->o, r->bar, rank == 0, r->best) ||
                io_download(r->o, r->p, &r->io);
    ringattn_plan_destroy(plan);
    if (r->o->nccl) {
        ringattn_comm_destroy(r->comm);
        r->comm = NULL;
        r->failed |= exchange_alone(r);
    }
    return NULL;
}

/* ---------------------------------------------------------------- checks, table, main */

/* Normwise relative difference of sampled rows of a rank's t (local rows, heads x D each) from
   the single plan's (global rows); the worst so far in *worst. */
static void compare(const options_t *o, const rank_io_t *x, const unsigned char *t,
                    const unsigned char *ref, int heads, double *worst) {
    const int64_t width = (int64_t)heads * o->D, step = x->rows > 64 ? x->rows / 64 : 1;
    double e = 0.0, n = 0.0;
    for (int64_t r = 0; r < x->rows; r += step)
        for (int64_t c = 0; c < width; ++c) {
            const float a = from_dtype(t, r * width + c, o->bf16);
            const float b = from_dtype(ref, (int64_t)x->idx[r] * width + c, o->bf16);
            e += ((double)a - b) * ((double)a - b), n += (double)b * b;
        }
    const double rel = n > 0 ? sqrt(e / n) : sqrt(e);
    *worst = rel > *worst || rel != rel ? rel : *worst;
}

static double flop(const options_t *o, int bwd) { /* allowed pairs, FlashAttention's count */
    const double T = o->T, pairs = o->causal ? T * (T + 1) / 2 : T * T;
    return pairs * o->H * o->D * (bwd ? 10.0 : 4.0);
}

/* Device-to-device copy bandwidth now, bytes/s (a 64 MiB copy, best of 3; the emulation too). */
static double copy_bandwidth(void) {
    const size_t bytes = (size_t)64 << 20;
    void *a = cuda_memory_upload(&cuda, NULL, bytes), *b = cuda_memory_upload(&cuda, NULL, bytes);
    double best = INFINITY;
    for (int i = 0; a && b && i < 3; ++i) {
        const double t0 = now();
        cuda.copy(b, a, bytes, 3);
        cuda.sync();
        best = fmin(best, now() - t0);
    }
    if (a) cuda.free_(a);
    if (b) cuda.free_(b);
    return isfinite(best) ? bytes / best : 0.0;
}

/* One result. gpus: the devices the ranks ran on, so eff = single / (gpus x time) (1.0: the ring
   costs nothing over the single plan's kernels for the same work per device); hidden: the part
   of the exchange alone the ring hid behind its compute, (single / gpus + exch - time) / exch,
   in [0, 1]; bytes_lb: the bytes every rank received against the mask's lower bound. */
static void row(const options_t *o, const char *layout, int ranks, int gpus, int bwd, double secs,
                double single, double exch, double bytes_lb, double err) {
    const double tol = o->bf16 ? (bwd ? 2e-2 : 1e-2) : (bwd ? 1e-4 : 1e-5);
    const int wrong = !(err <= tol) || !(secs > 0) || !isfinite(secs);
    failures += wrong;
    const double hidden = exch > 0 ? fmin(1.0, fmax(0.0, (single / gpus + exch - secs) / exch)) : -1;
    char hid[16] = "-", lb[16] = "-";
    if (hidden >= 0) snprintf(hid, sizeof hid, "%.2f", hidden);
    if (bytes_lb > 0) snprintf(lb, sizeof lb, "%.2f", bytes_lb);
    printf("%6d %5d %4d %-6s %-5s %-7s %5d %4d %-8s %10.3f %8.2f %5.2f %8.3f %6s %8s %9.2e %5d\n",
           o->T, o->H, o->D, o->causal ? "causal" : "none", o->bf16 ? "bf16" : "f32", layout, ranks,
           gpus, bwd ? "backward" : "forward", 1e3 * secs, flop(o, bwd) / secs / 1e12,
           single / (gpus * secs), 1e3 * exch, hid, lb, err, wrong);
}

/* The fewest bytes the ranks must receive in all, per pass: each shard's K and V once by every
   other rank whose queries meet it (one sequence: causal or no mask), and in the backward its
   dK and dV float32 partial sums back from each of them. */
static void lower_bound(const options_t *o, const rank_t *r, int P, double bound[2]) {
    bound[0] = bound[1] = 0.0;
    int32_t first[8], last[8]; /* each rank's first and last token */
    for (int s = 0; s < P; ++s) {
        first[s] = INT32_MAX, last[s] = -1;
        for (int64_t i = 0; i < r[s].io.rows; ++i) {
            first[s] = r[s].io.idx[i] < first[s] ? r[s].io.idx[i] : first[s];
            last[s] = r[s].io.idx[i] > last[s] ? r[s].io.idx[i] : last[s];
        }
    }
    for (int s = 0; s < P; ++s) {
        const double kv = (double)r[s].io.rows * o->HKV * o->D;
        for (int q = 0; q < P; ++q) {
            if (q == s || r[s].io.rows == 0 || (o->causal && first[s] > last[q])) continue;
            bound[0] += kv * 2 * (o->bf16 ? 2 : 4);
            bound[1] += kv * (2 * (o->bf16 ? 2 : 4) + 2 * 4);
        }
    }
}

static const char *const layout_names[3] = {"contig", "zigzag", "striped"};

static void run_ring(const options_t *o, const problem_t *p, const rank_io_t *one,
                     const double single[2], double bandwidth, int P, int layout) {
    ringattn_comm_t comms[8] = {NULL};
    nccl_id_t ids[2];
    int devices = 1;
    if (o->nccl) { /* rank i on device i modulo the devices: one GPU each where there are P */
        if (nccl.get_id(&ids[0]) != 0 || nccl.get_id(&ids[1]) != 0 || cuda.device_count(&devices) != 0) {
            fprintf(stderr, BENCH_NAME ": ncclGetUniqueId or cudaGetDeviceCount failed\n");
            ++failures;
            return;
        }
    } else if (ringattn_comm_create_threads_device(P, -1, comms) != RINGATTN_SUCCESS) {
        fprintf(stderr, BENCH_NAME ": comm: %s\n", ringattn_last_error());
        ++failures;
        return;
    }
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)P);
    rank_t r[8];
    pthread_t th[8];
    for (int i = 0; i < P; ++i) {
        memset(&r[i], 0, sizeof r[i]);
        r[i].o = o, r[i].p = p, r[i].comm = comms[i], r[i].layout = layout, r[i].bar = &bar;
        r[i].rank = i, r[i].P = P, r[i].ids = ids, r[i].device = o->nccl ? i % devices : -1;
        pthread_create(&th[i], NULL, rank_main, &r[i]);
    }
    for (int i = 0; i < P; ++i) pthread_join(th[i], NULL);
    const int gpus = o->nccl && devices < P ? devices : o->nccl ? P : 1;
    if (r[0].skip[0]) {
        printf("# %d ranks over NCCL on %d GPU(s): skipped: %s\n", P, devices, r[0].skip);
        for (int i = 0; i < P; ++i) {
            io_free(&r[i].io);
            if (r[i].comm) ringattn_comm_destroy(r[i].comm);
        }
        pthread_barrier_destroy(&bar);
        return;
    }
    double bound[2], received[2] = {0.0, 0.0};
    lower_bound(o, r, P, bound);
    double err[2] = {0.0, 0.0};
    size_t most[2] = {0, 0};
    int failed = 0;
    for (int i = 0; i < P; ++i) {
        failed |= r[i].failed;
        if (!r[i].failed) {
            compare(o, &r[i].io, r[i].io.o, one->o, o->H, &err[0]);
            compare(o, &r[i].io, r[i].io.dq, one->dq, o->H, &err[1]);
            compare(o, &r[i].io, r[i].io.dk, one->dk, o->HKV, &err[1]);
        }
        for (int bwd = 0; bwd < 2; ++bwd) {
            most[bwd] = r[i].recv_bytes[bwd] > most[bwd] ? r[i].recv_bytes[bwd] : most[bwd];
            received[bwd] += (double)r[i].recv_bytes[bwd];
        }
        io_free(&r[i].io);
        if (comms[i]) ringattn_comm_destroy(comms[i]);
        if (o->nccl && r[i].comm) ringattn_comm_destroy(r[i].comm); /* its plan failed */
    }
    pthread_barrier_destroy(&bar);
    for (int bwd = 0; bwd < 2; ++bwd) {
        const double exch = o->nccl ? r[0].exch[bwd] : bandwidth > 0 ? most[bwd] / bandwidth : 0.0;
        row(o, layout_names[layout], P, gpus, bwd, failed ? -1.0 : r[0].best[bwd], single[bwd],
            isfinite(exch) ? exch : 0.0, bound[bwd] > 0 ? received[bwd] / bound[bwd] : 0.0,
            failed ? INFINITY : err[bwd]);
    }
}

static int parse_list(const char *v, int *out, int max, int lo, int hi) {
    int n = 0;
    for (const char *c = v; c && *c && n < max; c = strchr(c, ',') ? strchr(c, ',') + 1 : NULL) {
        out[n] = atoi(c);
        if (out[n] < lo || out[n] > hi) return 0;
        ++n;
    }
    return n;
}

static int parse(int argc, char **argv, options_t *o) {
    *o = (options_t){4096, 8, 2, 128, 1, 1, 5, 3, {2, 3, 4}, 1, {RINGATTN_LAYOUT_ZIGZAG}, 0};
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (!strcmp(a, "--seq")) o->T = v ? atoi(v) : 0, ok = ok && o->T > 0;
        else if (!strcmp(a, "--heads")) o->H = v ? atoi(v) : 0, ok = ok && o->H > 0;
        else if (!strcmp(a, "--kv-heads")) o->HKV = v ? atoi(v) : 0, ok = ok && o->HKV > 0;
        else if (!strcmp(a, "--dim")) o->D = v ? atoi(v) : 0, ok = ok && o->D > 0;
        else if (!strcmp(a, "--reps")) o->reps = v ? atoi(v) : 0, ok = ok && o->reps > 0;
        else if (!strcmp(a, "--mask")) ok = ok && (!strcmp(v, "causal") || !strcmp(v, "none")), o->causal = ok && !strcmp(v, "causal");
        else if (!strcmp(a, "--dtype")) ok = ok && (!strcmp(v, "bf16") || !strcmp(v, "f32")), o->bf16 = ok && !strcmp(v, "bf16");
        else if (!strcmp(a, "--transport")) ok = ok && (!strcmp(v, "nccl") || !strcmp(v, "device")), o->nccl = ok && !strcmp(v, "nccl");
        else if (!strcmp(a, "--ranks")) ok = ok && (o->nranks = parse_list(v, o->ranks, 8, 1, 8)) > 0;
        else if (!strcmp(a, "--layouts")) {
            o->nlayouts = 0;
            for (int l = 0; ok && l < 3; ++l)
                if (strstr(v, layout_names[l])) o->layouts[o->nlayouts++] = l;
            ok = ok && o->nlayouts > 0;
        } else ok = 0;
        if (!ok) {
            fprintf(stderr, "usage: " BENCH_NAME " [--seq T] [--heads H] [--kv-heads HK] [--dim D] "
                            "[--mask causal|none] [--dtype bf16|f32] [--ranks 2,3,4] "
                            "[--layouts contig,zigzag,striped] [--transport device|nccl] [--reps N]\n");
            return 0;
        }
        ++i;
    }
    return o->H % o->HKV == 0;
}

int bench_ring_cuda(int argc, char **argv) {
    options_t o;
    if (!parse(argc, argv, &o)) return 2;
    if (cuda_memory_load(&cuda, BENCH_NAME)) return 2;
    if (o.nccl && !nccl_load(&nccl)) {
        fprintf(stderr, BENCH_NAME ": --transport nccl: this library has no NCCL transport "
                        "(configure with -DRINGATTN_ENABLE_NCCL=ON)\n");
        return 2;
    }
    uint64_t seed = 42;
    problem_t p = {o.bf16 ? 2 : 4, NULL, NULL, NULL, NULL};
    const int64_t nq = (int64_t)o.T * o.H * o.D, nk = (int64_t)o.T * o.HKV * o.D;
    p.q = random_rows(nq, o.bf16, &seed), p.k = random_rows(nk, o.bf16, &seed);
    p.v = random_rows(nk, o.bf16, &seed), p.dout = random_rows(nq, o.bf16, &seed);
    printf("# ringattn %s bench_ring_cuda: backend cuda, transport %s, best of %d runs after a "
           "warm-up\n", ringattn_version_string(),
           o.nccl ? "nccl (ranks as threads, rank i on device i modulo the devices; the exchange "
                    "alone on a raw NCCL communicator)"
                  : "threads-device (ranks as threads on one device)", o.reps);
    const double bandwidth = o.nccl ? 0.0 : copy_bandwidth();
    if (!o.nccl) printf("# device-to-device copy bandwidth now: %.1f GB/s\n", bandwidth / 1e9);
    printf("%6s %5s %4s %-6s %-5s %-7s %5s %4s %-8s %10s %8s %5s %8s %6s %8s %9s %5s\n", "seq",
           "heads", "dim", "mask", "dtype", "layout", "ranks", "gpus", "pass", "time_ms", "TFLOP/s",
           "eff", "exch_ms", "hidden", "bytes_lb", "err", "wrong");
    const int32_t cu[2] = {0, o.T};
    const ringattn_plan_desc_t d = desc_of(&o, cu, RINGATTN_LAYOUT_CONTIGUOUS, -1);
    ringattn_plan_t plan = NULL;
    rank_io_t one;
    memset(&one, 0, sizeof one);
    double single[2] = {-1.0, -1.0};
    if (ringattn_plan_create(NULL, &d, &plan) != RINGATTN_SUCCESS || io_make(plan, &o, &p, &one) ||
        timed_passes(plan, &one, &o, NULL, 1, single) || io_download(&o, &p, &one)) {
        fprintf(stderr, BENCH_NAME ": single rank: %s\n", ringattn_last_error());
        return 1;
    }
    ringattn_plan_destroy(plan);
    for (int bwd = 0; bwd < 2; ++bwd) row(&o, "single", 1, 1, bwd, single[bwd], single[bwd], 0.0, 0.0, 0.0);
    for (int li = 0; li < o.nlayouts; ++li)
        for (int ri = 0; ri < o.nranks; ++ri) run_ring(&o, &p, &one, single, bandwidth, o.ranks[ri], o.layouts[li]);
    io_free(&one);
    free(p.q), free(p.k), free(p.v), free(p.dout);
    if (failures) printf("# %d wrong or failed result(s)\n", failures);
    return failures ? 1 : 0;
}
