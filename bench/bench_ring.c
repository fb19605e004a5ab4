/*
 * bench_ring: ringattn's ring over MPI (CPU backend), three questions.
 *
 *   mpirun -n 2 bench_ring [flags]        (run with --help; bench/README.md explains the output)
 *
 * 1. Parallel efficiency. For causal attention at T = 16384 (8 query heads on 2 kv heads,
 *    D = 128, float32) with each layout, eff = single-rank time / (P x ring time), forward and
 *    backward apart. The single-rank time is measured in the same run on rank 0 (a plan with
 *    comm = NULL and the same threads per rank) while the other ranks sleep.
 * 2. Traffic. The bytes each rank sends and receives per call (ringattn_plan_get_info) against
 *    the lower bound the mask allows: every shard must reach each OTHER rank that has at least
 *    one allowed (query, key) pair with it, worked out here from every rank's token map
 *    (ringattn_plan_local_tokens) and the SPEC 3 mask. Includes a window narrower than a shard
 *    on 4 ranks (over MPI when the job has 4 ranks, else over the threads transport inside
 *    rank 0): steps and bytes only, no times.
 * With --backend cuda it runs bench_ring_cuda.c instead: the CUDA ring with ranks as threads on
 * one device over the device-copy transport (no MPI ranks; bench/README.md).
 * With --ulysses LIST it runs bench_ring_ulysses.c instead: 2D plans (P_u x P/P_u) on CPU ranks
 * as threads, with the link model's estimate beside the times (no MPI ranks; bench/cp2d.md).
 * 3. Overlap. ring time against compute time (the same shards over the threads transport, minus
 *    its in-process copies) and exchange time (the ring's own messages alone, MPI_Isend/Irecv);
 *    hidden = (compute + exchange - ring) / exchange. Also the time the ring spends inside MPI
 *    calls, measured with the MPI profiling interface (PMPI wrappers in bench_ring_overlap.c).
 *
 * Every ring result is checked on a sample of rows against the single-rank plan's output on
 * rank 0 (O and LSE within 1e-5 relative, dQ, dK, dV within 1e-4 normwise, SPEC 9 float32),
 * and the single-rank output against float64; a wrong result makes every rank exit 1.
 * Output: a '#' banner, the table
 *     seq heads dim mask layout ranks pass time_ms GFLOP/s eff% wrong
 * then the traffic and overlap tables, the tracked figures, and JSON lines.
 *
 * This file: options, problems, the single-rank reference, the rings over MPI and over threads,
 * the checks, the results table and main. bench_ring_traffic.c: token maps and traffic;
 * bench_ring_overlap.c: PMPI timing, the exchange alone and overlap; bench_ring.h: what they
 * share; common.h: what every benchmark shares.
 */
#define _GNU_SOURCE /* pthread_attr_setaffinity_np; also clock_gettime, nanosleep, sysconf */
#include <mpi.h>
#include <ringattn.h>
#include <ringattn_mpi.h>

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_ring.h"

const char *const layout_names[NUM_LAYOUTS] = {"contig", "zigzag", "striped"};

int rank_, ranks_;
int failures;
FILE *json;

/* ---------------------------------------------------------------- utilities */

/* A barrier that sleeps: ranks waiting for rank 0's single-rank work leave the cores to it. */
static void idle_barrier(void) {
    MPI_Request r;
    int done = 0;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    while (!done) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done) nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
}

int all_ok(int ok) {
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return ok;
}

int api_ok(const char *fn, ringattn_status_t st) {
    if (st == RINGATTN_SUCCESS) return 1;
    fprintf(stderr, "bench_ring: [rank %d] %s: %s: %s\n", rank_, fn, ringattn_status_string(st),
            ringattn_last_error());
    return 0;
}

/* ---------------------------------------------------------------- problems and masks */

void mask_name(const shape_t *s, char *buf, size_t n) {
    if (s->window > 0) snprintf(buf, n, "win%d", s->window);
    else snprintf(buf, n, "%s", s->window == 0 ? "causal" : "none");
}

/* allowed keys [lo, hi] of query i (SPEC 3, one sequence, delta = 0) */
void key_range(const shape_t *s, int64_t i, int64_t *lo, int64_t *hi) {
    *lo = s->window > 0 && i - (s->window - 1) > 0 ? i - (s->window - 1) : 0;
    *hi = s->window >= 0 ? i : s->T - 1;
}

static double allowed_pairs(const shape_t *s) {
    double n = 0.0;
    for (int64_t i = 0; i < s->T; ++i) {
        int64_t lo, hi;
        key_range(s, i, &lo, &hi);
        n += (double)(hi - lo + 1);
    }
    return n;
}

static double flop(const shape_t *s, int bwd) { /* allowed pairs only, FlashAttention's count */
    return allowed_pairs(s) * s->H * 4.0 * s->D * (bwd ? 2.5 : 1.0);
}

static void problem_init(problem_t *p, shape_t s, uint64_t seed) {
    const int64_t nq = (int64_t)s.T * s.H * s.D, nk = (int64_t)s.T * s.HKV * s.D;
    p->s = s;
    p->cu[0] = 0, p->cu[1] = s.T;
    p->q = random_floats(nq, &seed);
    p->k = random_floats(nk, &seed);
    p->v = random_floats(nk, &seed);
    p->dout = random_floats(nq, &seed);
}

static void problem_free(problem_t *p) { free(p->q), free(p->k), free(p->v), free(p->dout); }

static ringattn_plan_desc_t make_desc(const problem_t *p, int layout, int threads) {
    ringattn_plan_desc_t d = one_sequence_desc(p->cu, p->s.H, p->s.HKV, p->s.D, threads);
    d.layout = (ringattn_layout_t)layout;
    d.causal = p->s.window >= 0;
    d.window_left = p->s.window > 0 ? p->s.window - 1 : -1;
    return d;
}

/* ---------------------------------------------------------------- outputs of one run */

static void outputs_alloc(outputs_t *x, const shape_t *s, int64_t rows) {
    const int64_t nq = rows * s->H * s->D, nk = rows * s->HKV * s->D;
    x->rows = rows;
    x->q = touched_floats(nq), x->dout = touched_floats(nq), x->o = touched_floats(nq);
    x->dq = touched_floats(nq), x->k = touched_floats(nk), x->v = touched_floats(nk);
    x->dk = touched_floats(nk), x->dv = touched_floats(nk), x->lse = touched_floats(rows * s->H);
}

static void outputs_free(outputs_t *x) {
    free(x->tokens), free(x->q), free(x->k), free(x->v), free(x->dout), free(x->o);
    free(x->lse), free(x->dq), free(x->dk), free(x->dv);
}

static ringattn_tensors_t tensors_of(const outputs_t *x) {
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = x->q, t.k.data = x->k, t.v.data = x->v, t.o.data = x->o, t.lse = x->lse;
    t.dout.data = x->dout, t.dq.data = x->dq, t.dk.data = x->dk, t.dv.data = x->dv;
    return t;
}

/* This rank's token map and rows of the global inputs, from the plan. */
static int take_rows(ringattn_plan_t plan, const problem_t *p, outputs_t *x) {
    int64_t n = 0;
    if (!api_ok("ringattn_plan_local_tokens", ringattn_plan_local_tokens(plan, &n, NULL))) return 0;
    outputs_alloc(x, &p->s, n);
    x->tokens = xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    int ok = api_ok("ringattn_plan_local_tokens", ringattn_plan_local_tokens(plan, &n, x->tokens));
    const ringattn_tensor_t none = RINGATTN_TENSOR_NONE;
    ringattn_tensor_t g = none, l = none;
    const struct { float *global, *local; int heads; } parts[4] = {
        {p->q, x->q, p->s.H}, {p->k, x->k, p->s.HKV}, {p->v, x->v, p->s.HKV}, {p->dout, x->dout, p->s.H}};
    for (int i = 0; i < 4 && ok; ++i) {
        g.data = parts[i].global, l.data = parts[i].local;
        ok = api_ok("ringattn_plan_scatter",
                    ringattn_plan_scatter(plan, RINGATTN_FLOAT32, parts[i].heads, p->s.D, g, l));
    }
    return ok;
}

/* ---------------------------------------------------------------- the single-rank reference */

static void sample_init(sample_t *smp, int T, int n, uint64_t seed) {
    smp->nrows = n < T ? n : T;
    smp->rows = xmalloc(sizeof(int32_t) * (size_t)smp->nrows);
    for (int i = 0; i < smp->nrows; ++i) smp->rows[i] = sample_row(i, smp->nrows, T, &seed);
}

/* float64 O, LSE, dQ of row i, head h (SPEC 2-7 for one row) */
static void reference_row(const problem_t *p, int64_t i, int h, double *o, double *lse, double *dq) {
    const shape_t *s = &p->s;
    int64_t lo, hi;
    key_range(s, i, &lo, &hi);
    const int64_t at = (i * s->H + h) * s->D;
    reference_row_range(p->q + at, p->dout + at, p->k, p->v, s->HKV, h / (s->H / s->HKV), s->D, lo,
                        hi, o, lse, dq);
}

static void check_single(const problem_t *p, const sample_t *smp, single_t *r) {
    const int H = p->s.H, D = p->s.D;
    double *o = xmalloc(sizeof(double) * (size_t)D), *dq = xmalloc(sizeof(double) * (size_t)D), lse;
    double eo = 0, ro = 0, el = 0, rl = 0, eq = 0, rq = 0;
    for (int n = 0; n < smp->nrows; ++n)
        for (int h = 0; h < H; ++h) {
            const int64_t i = smp->rows[n], at = (i * H + h) * D;
            reference_row(p, i, h, o, &lse, dq);
            for (int c = 0; c < D; ++c) {
                eo = fmax(eo, isfinite(r->out.o[at + c]) ? fabs(r->out.o[at + c] - o[c]) : INFINITY);
                ro = fmax(ro, fabs(o[c]));
                const double d = isfinite(r->out.dq[at + c]) ? r->out.dq[at + c] - dq[c] : INFINITY;
                eq += d * d, rq += dq[c] * dq[c];
            }
            const float l = r->out.lse[(int64_t)h * p->s.T + i];
            el = fmax(el, isfinite(l) ? fabs(l - lse) : INFINITY), rl = fmax(rl, fabs(lse));
        }
    r->err_fwd = fmax(eo / fmax(ro, 1e-30), el / fmax(rl, 1e-30));
    r->err_bwd = sqrt(eq) / fmax(sqrt(rq), 1e-30);
    free(o), free(dq);
}

static int rec_floats(const shape_t *s) { return 1 + 2 * s->H * s->D + s->H + 2 * s->HKV * s->D; }
static int pack_records(const shape_t *s, const sample_t *smp, const outputs_t *x, float *buf);
static void json_f64_errors(const problem_t *p, const float *recs, int n, const char *layout, int P);

/* Rank 0 runs the single-rank plan while the other ranks sleep; best of reps. */
static void run_single(const problem_t *p, int threads, int reps, const sample_t *smp, single_t *r) {
    memset(r, 0, sizeof *r);
    if (rank_ == 0) {
        const ringattn_plan_desc_t d = make_desc(p, 0, threads);
        ringattn_plan_t plan = NULL;
        r->ok = api_ok("ringattn_plan_create", ringattn_plan_create(NULL, &d, &plan));
        if (r->ok) r->ok = take_rows(plan, p, &r->out);
        const ringattn_tensors_t t = tensors_of(&r->out);
        r->fwd_s = r->bwd_s = INFINITY;
        for (int rep = 0; rep < reps && r->ok; ++rep) {
            double t0 = now();
            r->ok = api_ok("ringattn_forward", ringattn_forward(plan, &t, NULL));
            r->fwd_s = fmin(r->fwd_s, now() - t0);
            t0 = now();
            r->ok = r->ok && api_ok("ringattn_backward", ringattn_backward(plan, &t, NULL));
            r->bwd_s = fmin(r->bwd_s, now() - t0);
        }
        ringattn_plan_destroy(plan);
        if (r->ok) {
            check_single(p, smp, r);
            float *recs = xmalloc(sizeof(float) * (size_t)smp->nrows * rec_floats(&p->s));
            json_f64_errors(p, recs, pack_records(&p->s, smp, &r->out, recs), "single", 1);
            free(recs);
        }
    }
    idle_barrier();
}

/* ---------------------------------------------------------------- comparing ring rows */

typedef struct { /* maxima (O, LSE) and sums of squares (dQ, dK, dV) */
    double o_e, o_r, l_e, l_r, q_e, q_r, k_e, k_r, v_e, v_r;
} errs_t;


/* Packs the sampled rows this rank holds: [global index, O, LSE per head, dQ, dK, dV]. */
static int pack_records(const shape_t *s, const sample_t *smp, const outputs_t *x, float *buf) {
    const int H = s->H, HK = s->HKV, D = s->D;
    int32_t *local = xmalloc(sizeof(int32_t) * (size_t)s->T);
    for (int i = 0; i < s->T; ++i) local[i] = -1;
    for (int64_t i = 0; i < x->rows; ++i) local[x->tokens[i]] = (int32_t)i;
    int n = 0;
    for (int k = 0; k < smp->nrows; ++k) {
        const int64_t i = local[smp->rows[k]];
        if (i < 0) continue;
        float *r = buf + (size_t)n++ * rec_floats(s);
        *r++ = (float)smp->rows[k];
        memcpy(r, x->o + i * H * D, sizeof(float) * (size_t)(H * D)), r += H * D;
        for (int h = 0; h < H; ++h) *r++ = x->lse[(int64_t)h * x->rows + i];
        memcpy(r, x->dq + i * H * D, sizeof(float) * (size_t)(H * D)), r += H * D;
        memcpy(r, x->dk + i * HK * D, sizeof(float) * (size_t)(HK * D)), r += HK * D;
        memcpy(r, x->dv + i * HK * D, sizeof(float) * (size_t)(HK * D));
    }
    free(local);
    return n;
}

static void diff(const float *a, const float *ref, int n, double *e, double *r, int squares) {
    for (int c = 0; c < n; ++c) {
        const double d = isfinite(a[c]) ? fabs((double)a[c] - ref[c]) : INFINITY;
        if (squares) *e += d * d, *r += (double)ref[c] * ref[c];
        else *e = fmax(*e, d), *r = fmax(*r, fabs(ref[c]));
    }
}

static void compare_records(const shape_t *s, const float *recs, int n, const outputs_t *ref,
                            errs_t *e) {
    const int H = s->H, HK = s->HKV, D = s->D;
    for (int k = 0; k < n; ++k) {
        const float *r = recs + (size_t)k * rec_floats(s);
        const int64_t i = (int64_t)r[0];
        r += 1;
        diff(r, ref->o + i * H * D, H * D, &e->o_e, &e->o_r, 0), r += H * D;
        for (int h = 0; h < H; ++h, ++r) diff(r, ref->lse + (int64_t)h * s->T + i, 1, &e->l_e, &e->l_r, 0);
        diff(r, ref->dq + i * H * D, H * D, &e->q_e, &e->q_r, 1), r += H * D;
        diff(r, ref->dk + i * HK * D, HK * D, &e->k_e, &e->k_r, 1), r += HK * D;
        diff(r, ref->dv + i * HK * D, HK * D, &e->v_e, &e->v_r, 1);
    }
}

static double rel(double e, double r) { return e == 0.0 ? 0.0 : e / fmax(r, 1e-30); }
static double err_fwd(const errs_t *e) { return fmax(rel(e->o_e, e->o_r), rel(e->l_e, e->l_r)); }
static double err_bwd(const errs_t *e) {
    return fmax(rel(sqrt(e->q_e), sqrt(e->q_r)),
                fmax(rel(sqrt(e->k_e), sqrt(e->k_r)), rel(sqrt(e->v_e), sqrt(e->v_r))));
}

/* SPEC 9's norms of n records' O, LSE (max-relative) and dQ (normwise) against float64 rows,
   as a JSON "error" line (bench/plot.py's error against P). */
static void json_f64_errors(const problem_t *p, const float *recs, int n, const char *layout, int P) {
    const shape_t *s = &p->s;
    const int H = s->H, D = s->D;
    double *o = xmalloc(sizeof(double) * (size_t)D), *dq = xmalloc(sizeof(double) * (size_t)D), lse;
    double eo = 0, ro = 0, el = 0, eq = 0, rq = 0;
    for (int k = 0; k < n; ++k) {
        const float *r = recs + (size_t)k * rec_floats(s);
        const int64_t i = (int64_t)r[0];
        for (int h = 0; h < H; ++h) {
            reference_row(p, i, h, o, &lse, dq);
            const float *go = r + 1 + h * D, *gq = r + 1 + H * D + H + h * D;
            for (int c = 0; c < D; ++c) {
                eo = fmax(eo, fabs(go[c] - o[c])), ro = fmax(ro, fabs(o[c]));
                eq += (gq[c] - dq[c]) * (gq[c] - dq[c]), rq += dq[c] * dq[c];
            }
            el = fmax(el, fabs(r[1 + H * D + h] - lse) / fmax(1.0, fabs(lse)));
        }
    }
    if (json && n)
        fprintf(json, "{\"type\":\"error\",\"seq\":%d,\"mask\":\"%s\",\"layout\":\"%s\",\"ranks\":%d,"
                      "\"dtype\":\"f32\",\"rows\":%d,\"err_o\":%.4g,\"err_lse\":%.4g,\"err_dq\":%.4g}\n",
                s->T, s->window > 0 ? "window" : s->window == 0 ? "causal" : "none", layout, P, n,
                eo / fmax(ro, 1e-30), el, sqrt(eq) / fmax(sqrt(rq), 1e-30));
    free(o), free(dq);
}

/* ---------------------------------------------------------------- one ring configuration */

static void ring_free(ring_t *r) {
    if (r->map.P) map_free(&r->map);
    free(r->info);
    r->info = NULL;
}

/* Sampled rows of every rank to rank 0, compared there with the single-rank outputs. */
static void check_ring_mpi(const problem_t *p, const sample_t *smp, const outputs_t *x,
                           const single_t *ref, ring_t *r) {
    const shape_t *s = &p->s;
    const int rf = rec_floats(s);
    float *mine = xmalloc(sizeof(float) * (size_t)smp->nrows * rf);
    const int n = pack_records(s, smp, x, mine) * rf;
    int *cnt = xmalloc(sizeof(int) * (size_t)ranks_), *dsp = xmalloc(sizeof(int) * (size_t)ranks_);
    MPI_Gather(&n, 1, MPI_INT, cnt, 1, MPI_INT, 0, MPI_COMM_WORLD);
    int total = 0;
    for (int i = 0; rank_ == 0 && i < ranks_; ++i) dsp[i] = total, total += cnt[i];
    float *all = xmalloc(sizeof(float) * (size_t)(total + 1));
    MPI_Gatherv(mine, n, MPI_FLOAT, all, cnt, dsp, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (rank_ == 0) {
        errs_t e = {0};
        compare_records(s, all, total / rf, &ref->out, &e);
        r->err_fwd = total / rf == smp->nrows ? err_fwd(&e) : INFINITY; /* every row once */
        r->err_bwd = total / rf == smp->nrows ? err_bwd(&e) : INFINITY;
        json_f64_errors(p, all, total / rf, layout_names[r->layout], r->P);
    }
    free(mine), free(cnt), free(dsp), free(all);
}

static void run_ring_mpi(ringattn_comm_t comm, const problem_t *p, int layout, int threads,
                         int reps, const sample_t *smp, const single_t *ref, ring_t *r) {
    memset(r, 0, sizeof *r);
    r->layout = layout, r->P = ranks_;
    const ringattn_plan_desc_t d = make_desc(p, layout, threads);
    ringattn_plan_t plan = NULL;
    outputs_t x = {0};
    r->ok = all_ok(api_ok("ringattn_plan_create", ringattn_plan_create(comm, &d, &plan)));
    if (r->ok) r->ok = all_ok(take_rows(plan, p, &x));
    if (r->ok) {
        gather_maps(&p->s, &x, plan, r);
        const ringattn_tensors_t t = tensors_of(&x);
        r->ok = timed_pass(plan, &t, 0, reps, r) && timed_pass(plan, &t, 1, reps, r);
        r->timed = 1;
        if (r->ok) check_ring_mpi(p, smp, &x, ref, r);
    }
    outputs_free(&x);
    ringattn_plan_destroy(plan);
}

/* ---------------------------------------------------------------- the same over threads */

typedef struct {
    int r;
    ringattn_comm_t comm;
    const problem_t *p;
    ringattn_plan_desc_t desc;
    pthread_barrier_t *bar;
    int reps;
    outputs_t x;
    ringattn_plan_info_t info;
    double fwd_s, bwd_s, copy_fwd_s, copy_bwd_s;
    int ok;
} th_rank_t;

/* Time of copying `bytes` between two buffers, as the threads transport's receiver does. */
static double copy_time(size_t bytes) {
    if (!bytes) return 0.0;
    char *a = xmalloc(bytes), *b = xmalloc(bytes);
    memset(a, 1, bytes), memset(b, 0, bytes);
    const double t0 = now();
    memcpy(b, a, bytes);
    const double dt = now() - t0;
    free(a), free(b);
    return dt;
}

static void *th_main(void *arg) {
    th_rank_t *c = arg;
    ringattn_plan_t plan = NULL;
    c->ok = api_ok("ringattn_plan_create", ringattn_plan_create(c->comm, &c->desc, &plan));
    if (c->ok) c->ok = take_rows(plan, c->p, &c->x);
    c->info = (ringattn_plan_info_t)RINGATTN_PLAN_INFO_INIT;
    if (c->ok) c->ok = api_ok("ringattn_plan_get_info", ringattn_plan_get_info(plan, &c->info));
    const ringattn_tensors_t t = tensors_of(&c->x);
    c->fwd_s = c->bwd_s = INFINITY;
    for (int rep = 0; rep < c->reps; ++rep) { /* every thread reaches every barrier */
        pthread_barrier_wait(c->bar);
        double t0 = now();
        if (c->ok) c->ok = api_ok("ringattn_forward", ringattn_forward(plan, &t, NULL));
        c->fwd_s = fmin(c->fwd_s, now() - t0);
        pthread_barrier_wait(c->bar);
        t0 = now();
        if (c->ok) c->ok = api_ok("ringattn_backward", ringattn_backward(plan, &t, NULL));
        c->bwd_s = fmin(c->bwd_s, now() - t0);
    }
    pthread_barrier_wait(c->bar); /* the copies, all ranks at once as in the ring */
    c->copy_fwd_s = copy_time(c->info.forward_bytes_received);
    pthread_barrier_wait(c->bar);
    c->copy_bwd_s = copy_time(c->info.backward_bytes_received);
    ringattn_plan_destroy(plan);
    return NULL;
}

/* P ranks as threads of rank 0 (ringattn_comm_create_threads) while the other MPI ranks sleep. */
static void run_ring_threads(const problem_t *p, int layout, int P, int threads, int reps,
                             const sample_t *smp, const single_t *ref, ring_t *r) {
    memset(r, 0, sizeof *r);
    r->layout = layout, r->P = P, r->threads_transport = 1;
    if (rank_ == 0) {
        ringattn_comm_t *comms = xmalloc(sizeof(ringattn_comm_t) * (size_t)P);
        th_rank_t *th = calloc((size_t)P, sizeof *th);
        pthread_t *tid = xmalloc(sizeof(pthread_t) * (size_t)P);
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)P);
        /* mpirun may have bound rank 0 to one core (its default with as many ranks as cores);
           the thread ranks get every core, as the MPI ranks have between them. */
        pthread_attr_t attr;
        cpu_set_t cpus;
        CPU_ZERO(&cpus);
        for (long c = 0; c < sysconf(_SC_NPROCESSORS_ONLN) && c < CPU_SETSIZE; ++c) CPU_SET((int)c, &cpus);
        pthread_attr_init(&attr);
        pthread_attr_setaffinity_np(&attr, sizeof cpus, &cpus);
        const int have_comms = r->ok = api_ok("ringattn_comm_create_threads", ringattn_comm_create_threads(P, comms));
        for (int i = 0; i < P && r->ok; ++i) {
            th[i] = (th_rank_t){.r = i, .comm = comms[i], .p = p, .desc = make_desc(p, layout, threads),
                                .bar = &bar, .reps = reps};
            pthread_create(&tid[i], &attr, th_main, &th[i]);
        }
        int64_t *count = xmalloc(sizeof(int64_t) * (size_t)P);
        int32_t **tokens = xmalloc(sizeof(int32_t *) * (size_t)P);
        r->info = xmalloc(sizeof(ringattn_plan_info_t) * (size_t)P);
        errs_t e = {0};
        float *recs = xmalloc(sizeof(float) * (size_t)smp->nrows * rec_floats(&p->s));
        int nrec = 0;
        for (int i = 0; i < P && r->ok; ++i) pthread_join(tid[i], NULL);
        for (int i = 0; i < P && r->ok; ++i) r->ok = th[i].ok;
        for (int i = 0; i < P; ++i) {
            count[i] = th[i].x.rows, tokens[i] = th[i].x.tokens, th[i].x.tokens = NULL;
            r->info[i] = th[i].info;
            if (!r->ok) continue;
            r->fwd_s = fmax(r->fwd_s, th[i].fwd_s), r->bwd_s = fmax(r->bwd_s, th[i].bwd_s);
            r->copy_fwd_s = fmax(r->copy_fwd_s, th[i].copy_fwd_s);
            r->copy_bwd_s = fmax(r->copy_bwd_s, th[i].copy_bwd_s);
            th[i].x.tokens = tokens[i];
            const int n = pack_records(&p->s, smp, &th[i].x, recs);
            th[i].x.tokens = NULL;
            compare_records(&p->s, recs, n, &ref->out, &e), nrec += n;
        }
        if (r->ok) {
            for (int i = 0; i < P; ++i) tokens[i] = tokens[i] ? tokens[i] : calloc(1, sizeof(int32_t));
            map_build(&r->map, &p->s, P, count, tokens);
            r->err_fwd = nrec == smp->nrows ? err_fwd(&e) : INFINITY;
            r->err_bwd = nrec == smp->nrows ? err_bwd(&e) : INFINITY;
        } else {
            for (int i = 0; i < P; ++i) free(tokens[i]);
            free(count), free(tokens);
        }
        for (int i = 0; i < P; ++i) {
            outputs_free(&th[i].x);
            if (have_comms) ringattn_comm_destroy(comms[i]);
        }
        pthread_barrier_destroy(&bar);
        pthread_attr_destroy(&attr);
        free(recs), free(comms), free(th), free(tid);
    }
    idle_barrier();
    MPI_Bcast(&r->ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
}

/* ---------------------------------------------------------------- reporting (rank 0) */

static void table_header(void) {
    printf("%6s %5s %4s %-8s %-7s %5s %4s %10s %8s %6s %5s\n", "seq", "heads", "dim", "mask",
           "layout", "ranks", "pass", "time_ms", "GFLOP/s", "eff%", "wrong");
}

/* One row; secs < 0: not timed (traffic-only case); eff < 0: none (single rank). */
static void table_row(const shape_t *s, const char *layout, int ranks, int bwd, double secs,
                      double eff, double err, int ok, const char *transport) {
    if (rank_ != 0) return;
    char mask[32], t[32] = "-", g[32] = "-", e[32] = "-";
    mask_name(s, mask, sizeof mask);
    const int wrong = !ok || !(err <= (bwd ? 1e-4 : 1e-5)); /* SPEC 9, float32 */
    if (secs >= 0) snprintf(t, sizeof t, "%.1f", 1e3 * secs), snprintf(g, sizeof g, "%.1f", flop(s, bwd) / secs * 1e-9);
    if (eff >= 0) snprintf(e, sizeof e, "%.1f", 100.0 * eff);
    printf("%6d %5d %4d %-8s %-7s %5d %4s %10s %8s %6s %5d\n", s->T, s->H, s->D, mask, layout,
           ranks, bwd ? "bwd" : "fwd", t, g, e, wrong);
    fflush(stdout);
    if (wrong) {
        ++failures;
        fprintf(stderr, "bench_ring: WRONG: seq %d mask %s layout %s ranks %d %s: rel err %.3g%s\n",
                s->T, mask, layout, ranks, bwd ? "bwd" : "fwd", err, ok ? "" : " (failed)");
    }
    if (json)
        fprintf(json,
                "{\"type\":\"result\",\"seq\":%d,\"heads\":%d,\"kv_heads\":%d,\"dim\":%d,"
                "\"mask\":\"%s\",\"layout\":\"%s\",\"ranks\":%d,\"transport\":\"%s\",\"pass\":\"%s\","
                "\"time_ms\":%s,\"gflops\":%s,\"eff_pct\":%s,\"rel_err\":%.3g,\"wrong\":%d}\n",
                s->T, s->H, s->HKV, s->D, mask, layout, ranks, transport, bwd ? "bwd" : "fwd",
                secs >= 0 ? t : "null", secs >= 0 ? g : "null", eff >= 0 ? e : "null", err, wrong);
}

static void report_single(const shape_t *s, const single_t *r) {
    for (int bwd = 0; bwd < 2; ++bwd)
        table_row(s, "single", 1, bwd, r->ok ? (bwd ? r->bwd_s : r->fwd_s) : -1.0, -1.0,
                  r->ok ? (bwd ? r->err_bwd : r->err_fwd) : INFINITY, r->ok, "none");
}

static void report_ring(const shape_t *s, const ring_t *r, const single_t *ref) {
    const char *tr = r->threads_transport ? "threads" : "mpi";
    for (int bwd = 0; bwd < 2; ++bwd) {
        const double secs = bwd ? r->bwd_s : r->fwd_s, one = bwd ? ref->bwd_s : ref->fwd_s;
        const int timed = r->ok && r->timed;
        table_row(s, layout_names[r->layout], r->P, bwd, timed ? secs : -1.0,
                  timed && ref->ok ? one / (r->P * secs) : -1.0,
                  r->ok ? (bwd ? r->err_bwd : r->err_fwd) : INFINITY, r->ok, tr);
    }
}

/* A ring result that gets no table row still counts when wrong. */
static void check_quietly(const shape_t *s, const ring_t *r) {
    if (rank_ != 0) return;
    for (int bwd = 0; bwd < 2; ++bwd) {
        const double err = r->ok ? (bwd ? r->err_bwd : r->err_fwd) : INFINITY;
        if (err <= (bwd ? 1e-4 : 1e-5)) continue;
        ++failures;
        fprintf(stderr, "bench_ring: WRONG: seq %d layout %s ranks %d over threads %s: rel err %.3g\n",
                s->T, layout_names[r->layout], r->P, bwd ? "bwd" : "fwd", err);
    }
}

/* ---------------------------------------------------------------- main */

static void print_banner(const options_t *o, int threads) {
    const char *core = openblas_get_corename();
    printf("# ringattn %s bench_ring: backend cpu, transport mpi, ranks %d, threads per rank %d, "
           "float32\n", ringattn_version_string(), ranks_, threads);
    printf("# BLAS: %s (kernels: %s)%s\n", openblas_get_config(), core,
           !strcmp(core, "Prescott") ? " -- generic kernels: set OPENBLAS_CORETYPE (bench/README.md)" : "");
    printf("# efficiency: causal, T %d, heads %d/%d, D %d; eff%% = single-rank time / (ranks x ring "
           "time), single rank = rank 0 alone with %d thread(s)\n",
           o->main.T, o->main.H, o->main.HKV, o->main.D, threads);
    printf("# GFLOP/s counts allowed pairs only: fwd 4*D, bwd 10*D flop per pair per head; wrong = "
           "a sampled row off the single-rank result (or that off float64) beyond SPEC 9\n");
    if (json)
        fprintf(json, "{\"type\":\"banner\",\"version\":\"%s\",\"backend\":\"cpu\",\"transport\":\"mpi\","
                      "\"ranks\":%d,\"threads_per_rank\":%d,\"blas_core\":\"%s\"}\n",
                ringattn_version_string(), ranks_, threads, core);
}

static void print_figures(const ring_t *zz, const single_t *one, const overlap_t *ov, int nov) {
    printf("# tracked figures:\n");
    double eff[2] = {NAN, NAN};
    for (int bwd = 0; zz && zz->ok && one->ok && bwd < 2; ++bwd)
        eff[bwd] = (bwd ? one->bwd_s : one->fwd_s) / (zz->P * (bwd ? zz->bwd_s : zz->fwd_s));
    for (int bwd = 0; bwd < 2; ++bwd) {
        printf("#   causal zigzag efficiency, %s, P = %d: %.3f (target >= 0.85: %s)\n",
               bwd ? "backward" : "forward ", zz ? zz->P : 0, eff[bwd],
               !isfinite(eff[bwd]) ? "not measured" : eff[bwd] >= 0.85 ? "met" : "MISSED");
        if (json)
            fprintf(json, "{\"type\":\"figure\",\"name\":\"%s\",\"value\":%.4f,\"target\":0.85}\n",
                    bwd ? "zigzag_causal_bwd_eff" : "zigzag_causal_fwd_eff", isfinite(eff[bwd]) ? eff[bwd] : -1.0);
    }
    print_traffic_figures();
    print_overlap_figures(ov, nov);
}

/* Efficiency: the single-rank reference, then every layout over MPI. */
static void run_main(ringattn_comm_t comm, const options_t *o, int threads, problem_t *pb,
                     single_t *one, ring_t *rings, const sample_t *smp) {
    run_single(pb, threads, o->reps, smp, one);
    report_single(&pb->s, one);
    for (int i = 0; i < o->nlayouts; ++i) {
        run_ring_mpi(comm, pb, o->layouts[i], threads, o->reps, smp, one, &rings[i]);
        report_ring(&pb->s, &rings[i], one);
        remember_traffic(&pb->s, &rings[i]);
    }
}

/* Overlap of one shape: the MPI ring's zigzag result, compute over threads, exchange alone. */
static void run_overlap(const problem_t *pb, int threads, int reps, const sample_t *smp,
                        const single_t *one, const ring_t *mpi, ring_t *th, overlap_t *ov) {
    run_ring_threads(pb, 1, ranks_, threads, reps, smp, one, th);
    check_quietly(&pb->s, th); /* checked like every ring, but no table row */
    memset(ov, 0, sizeof *ov);
    ov->s = pb->s, ov->mpi = mpi, ov->threads = th;
    run_exchange(&pb->s, &mpi->map, 3, &ov->ex);
}

int main(int argc, char **argv) {
    /* --backend cuda: the CUDA ring with ranks as threads on one device (bench_ring_cuda.c),
       without MPI ranks: the device-copy transport moves no data between processes */
    for (int i = 1; i + 1 < argc; ++i)
        if (!strcmp(argv[i], "--backend") && !strcmp(argv[i + 1], "cuda")) {
            for (int j = i; j + 2 <= argc; ++j) argv[j] = argv[j + 2]; /* drop the pair */
            return bench_ring_cuda(argc - 2, argv);
        }
    /* --ulysses: 2D plans with ranks as threads of this process (bench_ring_ulysses.c), no MPI */
    for (int i = 1; i < argc; ++i)
        if (!strcmp(argv[i], "--ulysses")) return bench_ring_ulysses(argc, argv);
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
    openblas_set_num_threads(1); /* ranks as threads share OpenBLAS's setting; tiles are small */
    options_t o;
    const int parsed = parse_options(argc, argv, &o);
    if (parsed <= 0) {
        MPI_Finalize();
        return parsed < 0 ? 0 : 2;
    }
    const int threads = o.threads ? o.threads : threads_per_rank();
    if (rank_ == 0 && !o.no_json) json = json_open(o.json_path);
    ringattn_comm_t comm = NULL;
    if (!all_ok(api_ok("ringattn_comm_create_mpi", ringattn_comm_create_mpi(MPI_COMM_WORLD, &comm)))) {
        MPI_Finalize();
        return 2;
    }
    if (rank_ == 0) print_banner(&o, threads), table_header();

    /* 1. efficiency (and its traffic) */
    problem_t pb;
    sample_t smp;
    single_t one;
    ring_t rings[NUM_LAYOUTS];
    problem_init(&pb, o.main, 42);
    sample_init(&smp, o.main.T, o.sample, 7);
    run_main(comm, &o, threads, &pb, &one, rings, &smp);
    const ring_t *zz = NULL;
    for (int i = 0; i < o.nlayouts; ++i)
        if (o.layouts[i] == 1 && rings[i].ok) zz = &rings[i];

    /* 3. overlap: the main shape and an exchange-heavy one, zigzag */
    overlap_t ov[2];
    ring_t th[2], heavy_ring;
    single_t heavy_one;
    problem_t hp;
    sample_t hsmp;
    int nov = 0;
    if (o.overlap && zz) {
        run_overlap(&pb, threads, o.reps, &smp, &one, zz, &th[0], &ov[nov]);
        nov += th[0].ok;
    }
    problem_free(&pb), outputs_free(&one.out);
    if (o.overlap && o.heavy.T > 0) {
        problem_init(&hp, o.heavy, 43);
        sample_init(&hsmp, o.heavy.T, o.sample, 8);
        const int hreps = o.reps > 3 ? o.reps : 3; /* short runs: best of 3 at least */
        run_single(&hp, threads, hreps, &hsmp, &heavy_one);
        report_single(&hp.s, &heavy_one);
        run_ring_mpi(comm, &hp, 1, threads, hreps, &hsmp, &heavy_one, &heavy_ring);
        report_ring(&hp.s, &heavy_ring, &heavy_one);
        remember_traffic(&hp.s, &heavy_ring);
        if (heavy_ring.ok) {
            run_overlap(&hp, threads, hreps, &hsmp, &heavy_one, &heavy_ring, &th[1], &ov[nov]);
            nov += th[1].ok;
        }
        problem_free(&hp), outputs_free(&heavy_one.out), free(hsmp.rows);
    }

    /* 2. traffic: a window narrower than a shard, every layout; checked, not timed */
    ring_t wr[NUM_LAYOUTS];
    single_t wone;
    problem_t wp;
    sample_t wsmp;
    const int nw = o.win_ranks > 1 ? o.nlayouts : 0;
    if (nw) {
        problem_init(&wp, o.win, 44);
        sample_init(&wsmp, o.win.T, o.sample, 9);
        run_single(&wp, threads, 1, &wsmp, &wone);
        report_single(&wp.s, &wone);
        for (int i = 0; i < nw; ++i) {
            if (o.win_ranks == ranks_) run_ring_mpi(comm, &wp, o.layouts[i], threads, 1, &wsmp, &wone, &wr[i]);
            else run_ring_threads(&wp, o.layouts[i], o.win_ranks, 1, 1, &wsmp, &wone, &wr[i]);
            wr[i].timed = 0;
            report_ring(&wp.s, &wr[i], &wone);
            remember_traffic(&wp.s, &wr[i]);
        }
        problem_free(&wp), outputs_free(&wone.out), free(wsmp.rows);
    }

    /* 4. decode against a sharded KV cache */
    if (o.ndecode) run_decode(&o, threads);

    if (rank_ == 0) {
        print_traffic();
        if (nov) print_overlap(ov, nov);
        print_figures(zz, &one, ov, nov);
        json_close(json, o.json_path); /* the JSON lines after the tables, unless --json FILE */
        if (failures) printf("# %d wrong or failed result(s)\n", failures);
    }
    MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
    for (int i = 0; i < o.nlayouts; ++i) ring_free(&rings[i]);
    for (int i = 0; i < nw; ++i) ring_free(&wr[i]);
    for (int i = 0; o.overlap && i < 2; ++i)
        if ((i == 0 && zz) || (i == 1 && o.heavy.T > 0 && heavy_ring.ok)) ring_free(&th[i]);
    if (o.overlap && o.heavy.T > 0) ring_free(&heavy_ring);
    free(smp.rows);
    ringattn_comm_destroy(comm);
    MPI_Finalize();
    return failures ? 1 : 0;
}
