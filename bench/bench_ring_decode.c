/*
 * bench_ring, question 4: decode against a KV cache sharded over P ranks (ringattn.h:
 * sharded_cache). For each cache size L and each P = 1 .. the job's ranks (the first P ranks of
 * the job, the others idle), one query token per call against a cache of L keys split
 * contiguously over the P ranks (causal: the query sees every key), H 8 / H_kv 2, D 128,
 * float32 by default. Each rank makes its own slots from a hash of (key, head, column), so any
 * rank can rebuild any key; rank 0 checks the first step's O and LSE against float64 over the
 * whole cache. Reported: ms per token (the slowest rank, median of the steps), tokens/s, the
 * bytes the P ranks move per token (ringattn_plan_get_info: the partials, O(H D)) against the
 * cache's bytes, and the error.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime (common.h) */
#include <ringattn_mpi.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_ring.h"

/* Element i of the tensor named by seed: uniform [-1, 1), the same on every rank. */
static float hashed(uint64_t seed, uint64_t i) {
    uint64_t s = seed ^ (i * 0x9E3779B97F4A7C15ull);
    return (float)(2.0 * unit(&s) - 1.0);
}

enum { SEED_Q = 101, SEED_K = 202, SEED_V = 303 };

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    int64_t L;
    int P;
    double ms, bytes, err;
    int ok;
} decode_row_t;

/* float64 O [H, D] and LSE [H] of query q against every key of a cache of L (SPEC 2, causal). */
static void decode_reference(const options_t *o, int64_t L, const float *q, double *ref) {
    const int H = o->decode.H, HKV = o->decode.HKV, D = o->decode.D, g = H / HKV;
    const double scale = 1.0 / sqrt((double)D);
    double *m = ref + (size_t)H * D, *l = xmalloc(sizeof(double) * (size_t)H);
    float *k = xmalloc(sizeof(float) * (size_t)D), *v = xmalloc(sizeof(float) * (size_t)D);
    for (int h = 0; h < H; ++h) m[h] = -INFINITY, l[h] = 0.0;
    memset(ref, 0, sizeof(double) * (size_t)H * D);
    for (int64_t j = 0; j < L; ++j)
        for (int hk = 0; hk < HKV; ++hk) {
            for (int c = 0; c < D; ++c) {
                k[c] = hashed(SEED_K, (uint64_t)((j * HKV + hk) * D + c));
                v[c] = hashed(SEED_V, (uint64_t)((j * HKV + hk) * D + c));
            }
            for (int h = hk * g; h < (hk + 1) * g; ++h) { /* online softmax, float64 */
                double s = 0.0;
                for (int c = 0; c < D; ++c) s += (double)q[h * D + c] * k[c];
                s *= scale;
                const double mn = fmax(m[h], s), a = exp(m[h] - mn), p = exp(s - mn);
                for (int c = 0; c < D; ++c) ref[h * D + c] = ref[h * D + c] * a + p * v[c];
                l[h] = l[h] * a + p, m[h] = mn;
            }
        }
    for (int h = 0; h < H; ++h) {
        for (int c = 0; c < D; ++c) ref[h * D + c] /= l[h];
        m[h] += log(l[h]); /* now LSE */
    }
    free(l), free(k), free(v);
}

/* One (L, P): the first P ranks decode `steps` tokens; every rank of the job takes part in
   the collectives that time and check it. */
static decode_row_t decode_run(const options_t *o, int64_t L, int P, int threads, const double *ref) {
    const int H = o->decode.H, HKV = o->decode.HKV, D = o->decode.D, in = rank_ < P;
    decode_row_t row = {L, P, 0, 0, 0, 1};
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, in ? 0 : MPI_UNDEFINED, rank_, &sub);
    ringattn_comm_t comm = NULL;
    ringattn_plan_t plan = NULL;
    const int32_t cu_q[2] = {0, 1}, cu_k[2] = {0, (int32_t)L};
    float *q = xmalloc(sizeof(float) * (size_t)H * D), *out = xmalloc(sizeof(float) * (size_t)H * D);
    float *lse = xmalloc(sizeof(float) * (size_t)H), *k = NULL, *v = NULL;
    double *ms = xmalloc(sizeof(double) * (size_t)o->decode_steps);
    int ok = 1;
    if (in) {
        ok = api_ok("ringattn_comm_create_mpi", ringattn_comm_create_mpi(sub, &comm));
        ringattn_plan_desc_t d = one_sequence_desc(cu_q, H, HKV, D, threads);
        d.cu_seqlens_k = cu_k, d.causal = 1, d.sharded_cache = 1;
        ok = ok && api_ok("ringattn_plan_create", ringattn_plan_create(comm, &d, &plan));
        int64_t n = 0;
        ok = ok && api_ok("ringattn_plan_local_keys", ringattn_plan_local_keys(plan, &n, NULL));
        int32_t *idx = xmalloc(sizeof(int32_t) * (size_t)(n + 1));
        ok = ok && api_ok("ringattn_plan_local_keys", ringattn_plan_local_keys(plan, &n, idx));
        k = xmalloc(sizeof(float) * (size_t)(n * HKV * D + 1));
        v = xmalloc(sizeof(float) * (size_t)(n * HKV * D + 1));
        for (int64_t r = 0; ok && r < n; ++r)
            for (int64_t e = 0; e < (int64_t)HKV * D; ++e) {
                k[r * HKV * D + e] = hashed(SEED_K, (uint64_t)(idx[r] * HKV * D + e));
                v[r * HKV * D + e] = hashed(SEED_V, (uint64_t)(idx[r] * HKV * D + e));
            }
        free(idx);
        ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
        t.q.data = q, t.k.data = k, t.v.data = v, t.o.data = out, t.lse = lse;
        for (int s = 0; ok && s < o->decode_steps; ++s) {
            for (int e = 0; e < H * D; ++e) q[e] = hashed(SEED_Q + (uint64_t)s, (uint64_t)e);
            MPI_Barrier(sub);
            const double t0 = now();
            ok = api_ok("ringattn_forward", ringattn_forward(plan, &t, NULL));
            double dt = now() - t0;
            MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, sub);
            ms[s] = 1e3 * dt;
            if (s == 0 && rank_ == 0 && ok) { /* the first step's query is the reference's */
                double e = 0.0, r = 0.0, el = 0.0; /* SPEC 9's norms: O max-relative, LSE */
                for (int i = 0; i < H * D; ++i) e = fmax(e, fabs(out[i] - ref[i])), r = fmax(r, fabs(ref[i]));
                for (int h = 0; h < H; ++h)
                    el = fmax(el, fabs(lse[h] - ref[H * D + h]) / fmax(1.0, fabs(ref[H * D + h])));
                row.err = fmax(e / fmax(r, 1e-30), el);
            }
        }
        ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
        if (ok) ringattn_plan_get_info(plan, &info);
        double sent = (double)info.forward_bytes_sent;
        MPI_Allreduce(MPI_IN_PLACE, &sent, 1, MPI_DOUBLE, MPI_SUM, sub);
        row.bytes = sent;
        ringattn_plan_destroy(plan);
        ringattn_comm_destroy(comm);
        MPI_Comm_free(&sub);
    }
    row.ok = all_ok(ok);
    qsort(ms, (size_t)o->decode_steps, sizeof *ms, cmp_double);
    row.ms = ms[o->decode_steps / 2];
    free(q), free(out), free(lse), free(k), free(v), free(ms);
    return row;
}

void run_decode(const options_t *o, int threads) {
    const int H = o->decode.H, HKV = o->decode.HKV, D = o->decode.D;
    if (rank_ == 0)
        printf("\n# decode: one query token per call against a cache of L keys split contiguously "
               "over P ranks (sharded_cache), causal, heads %d/%d, D %d, float32, %d calls each\n"
               "# ms = the slowest rank, median call; moved = bytes the P ranks send per token "
               "(the partials); cache = K and V bytes\n"
               "%8s %5s %9s %9s %12s %14s %10s %9s %5s\n",
               H, HKV, D, o->decode_steps, "cache", "ranks", "ms/token", "tokens/s", "moved",
               "cache_bytes", "moved/cache", "rel_err", "wrong");
    float *q0 = xmalloc(sizeof(float) * (size_t)H * D);
    for (int e = 0; e < H * D; ++e) q0[e] = hashed(SEED_Q, (uint64_t)e);
    double *ref = xmalloc(sizeof(double) * (size_t)(H * D + H));
    for (int c = 0; c < o->ndecode; ++c) {
        const int64_t L = o->decode_cache[c];
        if (rank_ == 0) decode_reference(o, L, q0, ref);
        for (int P = 1; P <= ranks_; ++P) {
            const decode_row_t r = decode_run(o, L, P, threads, ref);
            if (rank_ != 0) continue;
            const double cache = (double)L * HKV * 2 * D * sizeof(float);
            const int wrong = !r.ok || !(r.err <= 1e-5);
            failures += wrong;
            printf("%8lld %5d %9.3f %9.1f %12.0f %14.0f %10.2e %9.2e %5d\n", (long long)L, P, r.ms,
                   1e3 / r.ms, r.bytes, cache, r.bytes / cache, r.err, wrong);
            fflush(stdout);
            if (json)
                fprintf(json, "{\"type\":\"decode\",\"cache\":%lld,\"ranks\":%d,\"heads\":%d,"
                              "\"kv_heads\":%d,\"dim\":%d,\"ms_per_token\":%.4f,\"tokens_per_s\":%.2f,"
                              "\"bytes_moved\":%.0f,\"cache_bytes\":%.0f,\"rel_err\":%.3g,\"wrong\":%d}\n",
                        (long long)L, P, H, HKV, D, r.ms, 1e3 / r.ms, r.bytes, cache, r.err, wrong);
        }
    }
    free(q0), free(ref);
}
