/*
 * bench_ring --ulysses LIST: 2D context parallelism (ringattn.h: ulysses_size) on the CPU, P
 * ranks as threads of this process (the threads transport; no mpirun), one P_u x P/P_u plan per
 * entry of LIST: 1 is the flat ring of P, P the all-to-all alone.
 *
 *   bench_ring --ulysses 1,2,4 [--ranks P] [--seq T] [--heads H] [--kv-heads HKV] [--dim D]
 *              [--mask causal|none] [--layout contiguous|zigzag|striped] [--strided]
 *              [--threads N] [--reps N] [model flags: tools/link_model.h]
 *
 * For each P_u, forward and backward: time_ms, the best of --reps runs, from a barrier of every
 * rank to the slowest rank's return; the bytes each link class moves per call (the most any
 * rank sends and receives: the all-to-all inside the groups, the ring between them;
 * ringattn_plan_get_info); the link model's estimate for this machine (model_ms: compute,
 * all-to-all and the ring time not hidden behind compute, of the slowest rank) with its rates
 * measured here: the single-rank plan's GFLOP/s shared among the ranks as they share the
 * cores, and one thread's memcpy bandwidth for both link classes (what the threads transport
 * does), 10 us a message; the model flags replace any of them. gpu_comm_ms is the model's
 * exchange time of the same bytes on the default links (NVLink 4, 400 Gb/s InfiniBand, 8 GPUs
 * a node): all-to-all plus ring exchanges, hidden or not. Every rank's O and LSE (max-norm) and
 * dQ, dK, dV (normwise) are compared with the single-rank plan's, float32: 1e-5 and 1e-4
 * relative, as bench_ring's rings; a wrong or failed result makes the exit status 1.
 */
#define _GNU_SOURCE /* sysconf */
#include <ringattn.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BENCH_NAME "bench_ring"
#include "../tools/link_model.h"
#include "common.h"

int bench_ring_ulysses(int argc, char **argv);

enum { MAX_LIST = 8, MAX_P = 64 };

typedef struct {
    int list[MAX_LIST], n, P, T, H, HKV, D, causal, layout, strided, threads, reps;
    lm_params_t cpu; /* fields < 0: not given, measured here */
} uopts_t;

typedef struct { /* global inputs and the single-rank outputs */
    int32_t cu[2];
    float *q, *k, *v, *dout, *o, *lse, *dq, *dk, *dv;
    double fwd_s, bwd_s, flops;
} uproblem_t;

typedef struct {
    const uopts_t *o;
    const uproblem_t *p;
    ringattn_comm_t comm;
    pthread_barrier_t *bar;
    ringattn_plan_desc_t d;
    int64_t rows;
    int32_t *tokens;
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
    ringattn_plan_info_t info;
    double fwd_s, bwd_s;
    int ok;
} urank_t;

static int say(const char *a, const char *v, const char *expected) {
    fprintf(stderr, "bench_ring: %s%s%s: expected %s (see --help)\n", a, v ? " " : "", v ? v : "", expected);
    return 0;
}

static int whole(const char *v, int lo, int hi, int *out) {
    char *end = NULL;
    const long n = strtol(v, &end, 10);
    if (end == v || *end || n < lo || n > hi) return 0;
    *out = (int)n;
    return 1;
}

static int parse(int argc, char **argv, uopts_t *o) {
    static const char *const layouts[] = {"contiguous", "zigzag", "striped"};
    *o = (uopts_t){.P = 4, .T = 8192, .H = 8, .HKV = 2, .D = 64, .causal = 1, .layout = 1, .reps = 2,
                   .cpu = {-1, -1, -1, -1, -1, -1, -1}};
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--strided")) { o->strided = 1; continue; }
        const int lm = lm_parse_flag("bench_ring", a, v, &o->cpu);
        if (lm < 0) return 0;
        if (!v) return say(a, NULL, lm ? "" : "a known flag, with its value");
        ++i;
        if (lm) continue;
        struct { const char *flag; int *to, lo, hi; } ints[] = {
            {"--ranks", &o->P, 1, MAX_P}, {"--seq", &o->T, 1, 1 << 24}, {"--heads", &o->H, 1, 1 << 16},
            {"--kv-heads", &o->HKV, 1, 1 << 16}, {"--dim", &o->D, 1, 256},
            {"--threads", &o->threads, 0, 1 << 16}, {"--reps", &o->reps, 1, 1000}};
        int k = 0, n = (int)(sizeof ints / sizeof ints[0]);
        while (k < n && strcmp(a, ints[k].flag)) ++k;
        if (k < n) {
            if (!whole(v, ints[k].lo, ints[k].hi, ints[k].to)) return say(a, v, "a whole number in range");
        } else if (!strcmp(a, "--ulysses")) {
            char buf[128], *save = NULL;
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
                if (o->n == MAX_LIST || !whole(t, 1, MAX_P, &o->list[o->n++]))
                    return say(a, v, "up to 8 group sizes P_u[,P_u...]");
        } else if (!strcmp(a, "--mask")) {
            if (strcmp(v, "causal") && strcmp(v, "none")) return say(a, v, "causal or none");
            o->causal = !strcmp(v, "causal");
        } else if (!strcmp(a, "--layout")) {
            for (o->layout = 0; o->layout < 3 && strcmp(v, layouts[o->layout]); ++o->layout) continue;
            if (o->layout == 3) return say(a, v, "contiguous, zigzag or striped");
        } else {
            return say(a, NULL, "a flag of bench_ring --ulysses");
        }
    }
    if (o->H % o->HKV) return say("--heads", NULL, "a multiple of --kv-heads");
    for (int k = 0; k < o->n; ++k) /* the library refuses the rest (H, H_kv) with its message */
        if (o->P % o->list[k]) return say("--ulysses", NULL, "group sizes that divide --ranks");
    return o->n > 0 ? 1 : say("--ulysses", NULL, "at least one group size");
}

static ringattn_plan_desc_t make_desc(const uopts_t *o, const uproblem_t *p, int pu, int threads) {
    ringattn_plan_desc_t d = one_sequence_desc(p->cu, o->H, o->HKV, o->D, threads);
    d.causal = o->causal, d.layout = (ringattn_layout_t)o->layout;
    d.ulysses_size = pu, d.ulysses_strided = o->strided;
    return d;
}

static int ok_or_say(const char *fn, ringattn_status_t st) {
    if (st != RINGATTN_SUCCESS)
        fprintf(stderr, "bench_ring: %s: %s: %s\n", fn, ringattn_status_string(st), ringattn_last_error());
    return st == RINGATTN_SUCCESS;
}

static ringattn_tensors_t tensors(float *q, float *k, float *v, float *dout, float *o, float *lse,
                                  float *dq, float *dk, float *dv) {
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = q, t.k.data = k, t.v.data = v, t.dout.data = dout, t.o.data = o, t.lse = lse;
    t.dq.data = dq, t.dk.data = dk, t.dv.data = dv;
    return t;
}

/* The single-rank plan on every core: the reference outputs and the machine's GFLOP/s. */
static int run_single(const uopts_t *o, uproblem_t *p, int cores) {
    const int64_t T = o->T, nq = T * o->H * o->D, nk = T * o->HKV * o->D;
    p->o = touched_floats(nq), p->dq = touched_floats(nq), p->lse = touched_floats(T * o->H);
    p->dk = touched_floats(nk), p->dv = touched_floats(nk);
    const ringattn_plan_desc_t d = make_desc(o, p, 0, cores);
    ringattn_plan_t plan = NULL;
    int ok = ok_or_say("ringattn_plan_create", ringattn_plan_create(NULL, &d, &plan));
    const ringattn_tensors_t t = tensors(p->q, p->k, p->v, p->dout, p->o, p->lse, p->dq, p->dk, p->dv);
    p->fwd_s = p->bwd_s = INFINITY;
    for (int rep = 0; rep < o->reps && ok; ++rep) {
        double t0 = now();
        ok = ok_or_say("ringattn_forward", ringattn_forward(plan, &t, NULL));
        p->fwd_s = fmin(p->fwd_s, now() - t0), t0 = now();
        ok = ok && ok_or_say("ringattn_backward", ringattn_backward(plan, &t, NULL));
        p->bwd_s = fmin(p->bwd_s, now() - t0);
    }
    ringattn_plan_destroy(plan);
    const ringattn_plan_desc_t one = make_desc(o, p, 0, 0);
    int32_t *tokens = xmalloc(sizeof(int32_t) * (size_t)T);
    for (int32_t i = 0; i < o->T; ++i) tokens[i] = i;
    p->flops = 2.0 * (2 * o->D) * lm_pairs(&one, tokens, T) * o->H; /* FlashAttention's count */
    free(tokens);
    return ok;
}

/* One thread's memcpy bandwidth in GB/s (the threads transport copies each shard once). */
static double memcpy_gbs(void) {
    const size_t bytes = (size_t)64 << 20;
    char *a = xmalloc(bytes), *b = xmalloc(bytes);
    memset(a, 1, bytes), memset(b, 0, bytes);
    double best = INFINITY;
    for (int i = 0; i < 3; ++i) {
        const double t0 = now();
        memcpy(b, a, bytes);
        best = fmin(best, now() - t0);
    }
    volatile char sink = b[bytes / 2]; /* the copies are read: not optimised away */
    (void)sink;
    free(a), free(b);
    const double gbs = (double)bytes / best * 1e-9;
    return gbs;
}

static void copy_rows(const float *global, float *local, const int32_t *tokens, int64_t n, int width) {
    for (int64_t i = 0; i < n; ++i)
        memcpy(local + i * width, global + (int64_t)tokens[i] * width, sizeof(float) * (size_t)width);
}

static void *rank_main(void *arg) {
    urank_t *r = arg;
    const uopts_t *o = r->o;
    ringattn_plan_t plan = NULL;
    r->ok = ok_or_say("ringattn_plan_create", ringattn_plan_create(r->comm, &r->d, &plan));
    if (r->ok) r->ok = ok_or_say("ringattn_plan_local_tokens", ringattn_plan_local_tokens(plan, &r->rows, NULL));
    const int64_t n = r->ok ? r->rows : 0, wq = (int64_t)o->H * o->D, wk = (int64_t)o->HKV * o->D;
    r->tokens = xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    if (r->ok) r->ok = ok_or_say("ringattn_plan_local_tokens", ringattn_plan_local_tokens(plan, &r->rows, r->tokens));
    r->q = touched_floats(n * wq), r->dout = touched_floats(n * wq), r->out = touched_floats(n * wq);
    r->dq = touched_floats(n * wq), r->lse = touched_floats(n * o->H), r->k = touched_floats(n * wk);
    r->v = touched_floats(n * wk), r->dk = touched_floats(n * wk), r->dv = touched_floats(n * wk);
    if (r->ok) {
        copy_rows(r->p->q, r->q, r->tokens, n, (int)wq), copy_rows(r->p->dout, r->dout, r->tokens, n, (int)wq);
        copy_rows(r->p->k, r->k, r->tokens, n, (int)wk), copy_rows(r->p->v, r->v, r->tokens, n, (int)wk);
        r->ok = ok_or_say("ringattn_plan_get_info", ringattn_plan_get_info(plan, &r->info));
    }
    const ringattn_tensors_t t = tensors(r->q, r->k, r->v, r->dout, r->out, r->lse, r->dq, r->dk, r->dv);
    r->fwd_s = r->bwd_s = INFINITY;
    for (int rep = 0; rep < o->reps; ++rep) { /* every thread reaches every barrier */
        pthread_barrier_wait(r->bar);
        double t0 = now();
        if (r->ok) r->ok = ok_or_say("ringattn_forward", ringattn_forward(plan, &t, NULL));
        r->fwd_s = fmin(r->fwd_s, now() - t0);
        pthread_barrier_wait(r->bar);
        t0 = now();
        if (r->ok) r->ok = ok_or_say("ringattn_backward", ringattn_backward(plan, &t, NULL));
        r->bwd_s = fmin(r->bwd_s, now() - t0);
    }
    ringattn_plan_destroy(plan);
    return NULL;
}

/* Max-norm (squares 0) or normwise (squares 1) error of a rank's rows against the reference. */
static void err_rows(const float *x, const float *ref, const int32_t *tokens, int64_t n, int width,
                     int squares, double e[2]) {
    for (int64_t i = 0; i < n; ++i)
        for (int c = 0; c < width; ++c) {
            const double a = x[i * width + c], b = ref[(int64_t)tokens[i] * width + c];
            const double d = isfinite(a) ? fabs(a - b) : INFINITY;
            if (squares) e[0] += d * d, e[1] += b * b;
            else e[0] = fmax(e[0], d), e[1] = fmax(e[1], fabs(b));
        }
}

static double ratio(const double e[2], int squares) {
    return e[0] == 0 ? 0 : squares ? sqrt(e[0]) / fmax(sqrt(e[1]), 1e-30) : e[0] / fmax(e[1], 1e-30);
}

/* Forward and backward errors of every rank against the single-rank outputs. */
static void errors(const uopts_t *o, const uproblem_t *p, const urank_t *rk, double err[2]) {
    double eo[2] = {0}, el[2] = {0}, eq[2] = {0}, ek[2] = {0}, ev[2] = {0};
    const int wq = o->H * o->D, wk = o->HKV * o->D;
    for (int r = 0; r < o->P; ++r) {
        const urank_t *x = &rk[r];
        err_rows(x->out, p->o, x->tokens, x->rows, wq, 0, eo), err_rows(x->dq, p->dq, x->tokens, x->rows, wq, 1, eq);
        err_rows(x->dk, p->dk, x->tokens, x->rows, wk, 1, ek), err_rows(x->dv, p->dv, x->tokens, x->rows, wk, 1, ev);
        for (int h = 0; h < o->H; ++h) /* LSE [H, rows] */
            err_rows(x->lse + (int64_t)h * x->rows, p->lse + (int64_t)h * o->T, x->tokens, x->rows, 1, 0, el);
    }
    err[0] = fmax(ratio(eo, 0), ratio(el, 0));
    err[1] = fmax(ratio(eq, 1), fmax(ratio(ek, 1), ratio(ev, 1)));
}

static size_t most(size_t a, size_t b) { return a > b ? a : b; }

/* One P_u: run it, check it, estimate it, print its two rows; 1 when right. */
static int run_config(const uopts_t *o, const uproblem_t *p, int pu, int threads, const lm_params_t *cpu) {
    const int P = o->P;
    ringattn_comm_t comms[MAX_P];
    urank_t rk[MAX_P];
    pthread_t tid[MAX_P];
    pthread_barrier_t bar;
    if (!ok_or_say("ringattn_comm_create_threads", ringattn_comm_create_threads(P, comms))) return 0;
    pthread_barrier_init(&bar, NULL, (unsigned)P);
    for (int r = 0; r < P; ++r) {
        rk[r] = (urank_t){.o = o, .p = p, .comm = comms[r], .bar = &bar, .d = make_desc(o, p, pu, threads),
                          .info = RINGATTN_PLAN_INFO_INIT};
        pthread_create(&tid[r], NULL, rank_main, &rk[r]);
    }
    int ok = 1;
    for (int r = 0; r < P; ++r) pthread_join(tid[r], NULL), ok &= rk[r].ok;
    double err[2] = {INFINITY, INFINITY}, t[2] = {0, 0}, model[2][4] = {{0}}, gpu[2] = {0, 0};
    size_t bytes[2][2][2] = {{{0}}}; /* [pass][a2a, ring][sent, received]: the most of any rank */
    const lm_params_t gpu_links = LM_DEFAULTS;
    if (ok) errors(o, p, rk, err);
    for (int r = 0; r < P && ok; ++r) {
        const ringattn_plan_info_t *i = &rk[r].info;
        const size_t b[2][2][2] = {{{i->alltoall_forward_bytes_sent, i->alltoall_forward_bytes_received},
                                    {i->forward_bytes_sent, i->forward_bytes_received}},
                                   {{i->alltoall_backward_bytes_sent, i->alltoall_backward_bytes_received},
                                    {i->backward_bytes_sent, i->backward_bytes_received}}};
        const double flops = lm_rank_flops(&rk[r].d, P, r);
        lm_estimate_t e, g;
        lm_estimate(cpu, i, o->strided, flops, &e);
        lm_estimate(&gpu_links, i, o->strided, flops, &g);
        for (int s = 0; s < 2; ++s) {
            t[s] = fmax(t[s], s ? rk[r].bwd_s : rk[r].fwd_s);
            if (e.call_ms[s] > model[s][0]) /* the slowest rank's estimate and its parts */
                model[s][0] = e.call_ms[s], model[s][1] = e.compute_ms[s], model[s][2] = e.a2a_ms[s],
                model[s][3] = e.exposed_ms[s];
            gpu[s] = fmax(gpu[s], g.a2a_ms[s] + g.ring_comm_ms[s]);
            for (int c = 0; c < 4; ++c) bytes[s][c / 2][c % 2] = most(bytes[s][c / 2][c % 2], b[s][c / 2][c % 2]);
        }
    }
    for (int s = 0; s < 2; ++s) {
        const int wrong = !ok || !(err[s] <= (s ? 1e-4 : 1e-5));
        char grid[16], a2a[32], ring[32];
        snprintf(grid, sizeof grid, "%d x %d", pu, P / pu);
        snprintf(a2a, sizeof a2a, "%.2f / %.2f", bytes[s][0][0] * 1e-6, bytes[s][0][1] * 1e-6);
        snprintf(ring, sizeof ring, "%.2f / %.2f", bytes[s][1][0] * 1e-6, bytes[s][1][1] * 1e-6);
        if (!ok) printf("%-8s %4s failed (the library's message is on stderr)\n", grid, s ? "bwd" : "fwd");
        else printf("%-8s %4s %9.1f %9.1f %8.1f %7.1f %8.1f %17s %17s %11.3f %9.2e %5d\n", grid,
                    s ? "bwd" : "fwd", t[s] * 1e3, model[s][0], model[s][1], model[s][2], model[s][3],
                    a2a, ring, gpu[s], err[s], wrong);
        if (wrong)
            fprintf(stderr, "bench_ring: WRONG: --ulysses %d %s: rel err %.3g%s\n", pu, s ? "bwd" : "fwd",
                    err[s], ok ? "" : " (failed)");
        ok &= !wrong;
    }
    fflush(stdout);
    for (int r = 0; r < P; ++r) {
        urank_t *x = &rk[r];
        free(x->tokens), free(x->q), free(x->k), free(x->v), free(x->dout), free(x->out);
        free(x->lse), free(x->dq), free(x->dk), free(x->dv);
        ringattn_comm_destroy(comms[r]);
    }
    pthread_barrier_destroy(&bar);
    return ok;
}

int bench_ring_ulysses(int argc, char **argv) {
    uopts_t o;
    for (int i = 1; i < argc; ++i)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: bench_ring --ulysses P_U[,P_U...] [--ranks P] [--seq T] [--heads H] [--kv-heads HKV]\n"
                   "                  [--dim D] [--mask causal|none] [--layout contiguous|zigzag|striped]\n"
                   "                  [--strided] [--threads N] [--reps N]\n%s"
                   "defaults: --ranks 4 --seq 8192 --heads 8 --kv-heads 2 --dim 64 --mask causal --layout\n"
                   "  zigzag --threads cores / P (at least 1) --reps 2; the model's CPU rates are measured\n"
                   "  now (single-rank GFLOP/s, memcpy GB/s, 10 us) unless given.\n", lm_usage);
            return 0;
        }
    if (!parse(argc, argv, &o)) return 2;
    openblas_set_num_threads(1); /* ranks as threads share OpenBLAS's setting; tiles are small */
    const int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const int threads = o.threads ? o.threads : (cores / o.P > 1 ? cores / o.P : 1);
    uint64_t seed = 42;
    const int64_t nq = (int64_t)o.T * o.H * o.D, nk = (int64_t)o.T * o.HKV * o.D;
    uproblem_t p = {.cu = {0, o.T}};
    p.q = random_floats(nq, &seed), p.k = random_floats(nk, &seed), p.v = random_floats(nk, &seed);
    p.dout = random_floats(nq, &seed);
    printf("# ringattn %s bench_ring --ulysses: backend cpu, transport threads, P = %d ranks as threads "
           "of %d core(s), %d thread(s) each, float32; T %d, heads %d/%d, D %d, %s, layout %s%s\n",
           ringattn_version_string(), o.P, cores, threads, o.T, o.H, o.HKV, o.D,
           o.causal ? "causal" : "no mask", o.layout == 0 ? "contiguous" : o.layout == 1 ? "zigzag" : "striped",
           o.strided ? ", strided groups" : "");
    print_blas("# warning: OpenBLAS chose its %s kernels although this CPU has %s; the tile products\n"
               "# run on them: set OPENBLAS_CORETYPE=%s (bench/README.md)\n");
    int ok = run_single(&o, &p, cores);
    if (!ok) return 1;
    /* the model's rates on this machine: the ranks share the cores the single rank had */
    const double share = fmin((double)threads * o.P, cores) / cores / o.P, gbs = memcpy_gbs();
    lm_params_t cpu = o.cpu;
    cpu.tflops = cpu.tflops < 0 ? p.flops / p.fwd_s * share * 1e-12 : cpu.tflops;
    cpu.tflops_bwd = cpu.tflops_bwd < 0 ? 2.5 * p.flops / p.bwd_s * share * 1e-12 : cpu.tflops_bwd;
    cpu.intra_gbs = cpu.intra_gbs < 0 ? gbs : cpu.intra_gbs, cpu.inter_gbs = cpu.inter_gbs < 0 ? gbs : cpu.inter_gbs;
    cpu.intra_lat_us = cpu.intra_lat_us < 0 ? 10 : cpu.intra_lat_us;
    cpu.inter_lat_us = cpu.inter_lat_us < 0 ? 10 : cpu.inter_lat_us;
    cpu.per_node = cpu.per_node < 0 ? o.P : cpu.per_node;
    printf("# single rank (%d threads): fwd %.1f ms (%.1f GFLOP/s), bwd %.1f ms (%.1f GFLOP/s); memcpy %.1f GB/s\n",
           cores, p.fwd_s * 1e3, p.flops / p.fwd_s * 1e-9, p.bwd_s * 1e3, 2.5 * p.flops / p.bwd_s * 1e-9, gbs);
    lm_print_params(stdout, "# CPU ", &cpu);
    printf("# model_ms = compute + a2a + exposed ring of the slowest rank; MB = 1e6 bytes per call, "
           "sent / received, the most of any rank; gpu_comm_ms: the same bytes on the default links\n");
    printf("%-8s %4s %9s %9s %8s %7s %8s %17s %17s %11s %9s %5s\n", "P_u x P_r", "pass", "time_ms",
           "model_ms", "compute", "a2a", "exposed", "a2a MB", "ring MB", "gpu_comm_ms", "rel_err", "wrong");
    for (int i = 0; i < o.n; ++i) ok &= run_config(&o, &p, o.list[i], threads, &cpu);
    free(p.q), free(p.k), free(p.v), free(p.dout), free(p.o), free(p.lse), free(p.dq), free(p.dk), free(p.dv);
    if (!ok) printf("# wrong or failed results (see stderr)\n");
    return ok ? 0 : 1;
}
