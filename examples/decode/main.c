/*
 * decode: a decode loop over a KV cache sharded across MPI ranks (ringattn.h: sharded_cache,
 * cache_bounds, cu_seqlens_new). No K/V moves: each rank attends the query to its own slots,
 * and only the (O, LSE) partials of the query travel (SPEC 5).
 *
 *   mpirun -n 4 decode [flags]        (see --help, and README.md next to this file)
 *
 * Default: a prompt of 16384 tokens already in the cache, then 64 decoded tokens; 8 query
 * heads on 2 kv heads, D = 128, float32, causal (--window W: a sliding window of W keys). The
 * cache fills rank by rank, as a serving system appends: each rank has `capacity` slots (by
 * default the final length / P, rounded up) and rank r holds positions [r C, (r + 1) C), so
 * the descriptor's cache_bounds say where each rank's filled slots end; the unfilled ones are
 * never read. Each step's token has Q, K, V made from one seed (the same on every rank): its
 * K/V are not in the cache yet, so they go in the same call as k_new/v_new (cu_seqlens_new),
 * attended by the last rank together with the cache, and afterwards the rank that owns the
 * next slot writes them there. The key count changes every step, so every step makes a plan
 * (collective, small); its time is printed apart from the call's.
 *
 * Rank 0 prints, for sampled steps: the cache length, the plan and call times (slowest rank),
 * the bytes all ranks sent for this token against the cache's bytes, and the error of O and
 * LSE against float64 over the whole cache (rebuilt from the seed), judged by SPEC 9. Exit 1
 * when an error is above tolerance, 2 on a usage or API error.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <mpi.h>
#include <ringattn.h>
#include <ringattn_mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/example_mpi.h" /* includes example_util.h */

typedef struct {
    int prompt, tokens, heads, kv_heads, dim, window, capacity, check_every, threads;
    ringattn_dtype_t dtype;
} options_t;

static int rank_, ranks_;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Element i of tensor `which` of token t, in [-1, 1), rounded to the storage dtype. */
static float value(const options_t *o, int which, int64_t t, int64_t i) {
    uint64_t s = ((uint64_t)which << 56) ^ ((uint64_t)t * 0x9E3779B97F4A7C15ull) ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull;
    return round_dtype(o->dtype, (float)uniform(&s));
}
enum { Q_OF = 1, K_OF = 2, V_OF = 3 };

/* Rows of token t: Q [H * D] or K/V [H_kv * D] into buf at row r, in the storage dtype. */
static void fill_row(const options_t *o, int which, int64_t t, void *buf, int64_t r) {
    const int n = (which == Q_OF ? o->heads : o->kv_heads) * o->dim;
    for (int i = 0; i < n; ++i) store(buf, o->dtype, r * n + i, value(o, which, t, i));
}

/* O [H * D] and LSE [H] of the query of position L - 1 over keys [lo, L) (float64, or with
   plain = 1 a plain float32 implementation whose O is rounded to the dtype, SPEC 9). */
static void reference(const options_t *o, int64_t L, int64_t lo, int plain, double *out, double *lse) {
    const int H = o->heads, HKV = o->kv_heads, D = o->dim, g = H / HKV;
    const double scale = 1.0 / sqrt((double)D);
    double *m = xmalloc(sizeof(double) * (size_t)H), *l = xmalloc(sizeof(double) * (size_t)H);
    for (int h = 0; h < H; ++h) m[h] = -INFINITY, l[h] = 0.0;
    memset(out, 0, sizeof(double) * (size_t)H * D);
#define R(x) (plain ? (double)(float)(x) : (x))
    for (int64_t j = lo; j < L; ++j)
        for (int h = 0; h < H; ++h) {
            const int hk = h / g;
            double s = 0.0;
            for (int c = 0; c < D; ++c)
                s = R(s + (double)value(o, Q_OF, L - 1, h * D + c) * value(o, K_OF, j, hk * D + c));
            s = R(s * scale);
            const double mn = fmax(m[h], s), a = R(exp(m[h] - mn)), p = R(exp(s - mn));
            for (int c = 0; c < D; ++c)
                out[h * D + c] = R(out[h * D + c] * a + p * value(o, V_OF, j, hk * D + c));
            l[h] = R(l[h] * a + p), m[h] = mn;
        }
    for (int h = 0; h < H; ++h) {
        for (int c = 0; c < D; ++c) {
            out[h * D + c] = R(out[h * D + c] / l[h]);
            if (plain) out[h * D + c] = round_dtype(o->dtype, (float)out[h * D + c]);
        }
        lse[h] = R(m[h] + log(l[h]));
    }
#undef R
    free(m), free(l);
}

/* SPEC 9 norms of O [H * D] (max-relative) and LSE (against max(1, |LSE|)). */
static void errors(const options_t *o, const double *ro, const double *rl, const double *go,
                   const double *gl, double *eo, double *el) {
    double e = 0, r = 0;
    *el = 0;
    for (int i = 0; i < o->heads * o->dim; ++i) e = fmax(e, fabs(go[i] - ro[i])), r = fmax(r, fabs(ro[i]));
    for (int h = 0; h < o->heads; ++h) *el = fmax(*el, fabs(gl[h] - rl[h]) / fmax(1.0, fabs(rl[h])));
    *eo = rel(e, r);
}

static int usage(int code) {
    if (rank_ == 0)
        printf("usage: mpirun -n P decode [--prompt N] [--tokens N] [--heads H] [--kv-heads HKV]\n"
               "              [--dim D] [--window W] [--capacity C] [--dtype f32|f16|bf16]\n"
               "              [--check-every N] [--threads N]\n"
               "defaults: --prompt 16384 --tokens 64 --heads 8 --kv-heads 2 --dim 128 --window 0\n"
               "  (causal; W > 0: a sliding window of W keys) --capacity 0 (the final length / P,\n"
               "  rounded up) --dtype f32 --check-every 16 --threads 0 (cores / ranks)\n");
    return code;
}

static int parse(int argc, char **argv, options_t *o) {
    *o = (options_t){16384, 64, 8, 2, 128, 0, 0, 16, 0, RINGATTN_FLOAT32};
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return -1;
        if (!v) return 0;
        ++i;
        if (!strcmp(a, "--prompt")) o->prompt = atoi(v);
        else if (!strcmp(a, "--tokens")) o->tokens = atoi(v);
        else if (!strcmp(a, "--heads")) o->heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) o->kv_heads = atoi(v);
        else if (!strcmp(a, "--dim")) o->dim = atoi(v);
        else if (!strcmp(a, "--window")) o->window = atoi(v);
        else if (!strcmp(a, "--capacity")) o->capacity = atoi(v);
        else if (!strcmp(a, "--check-every")) o->check_every = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--dtype")) { if (!parse_dtype(v, &o->dtype)) return 0; }
        else return 0;
    }
    const int64_t final_len = (int64_t)o->prompt + o->tokens;
    if (!o->capacity) o->capacity = (int)((final_len + ranks_ - 1) / ranks_);
    return o->prompt >= 0 && o->tokens > 0 && o->heads > 0 && o->kv_heads > 0 &&
           o->heads % o->kv_heads == 0 && o->dim > 0 && o->window >= 0 && o->check_every > 0 &&
           (int64_t)o->capacity * ranks_ >= final_len;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
    options_t o;
    const int parsed = parse(argc, argv, &o);
    if (parsed <= 0) {
        if (parsed == 0 && rank_ == 0) fprintf(stderr, "decode: bad flags\n");
        MPI_Finalize();
        return usage(parsed < 0 ? 0 : 2);
    }
    const int threads = o.threads ? o.threads : threads_per_rank();
    const int H = o.heads, HKV = o.kv_heads, D = o.dim, C = o.capacity;
    const size_t e = dtype_size(o.dtype), kv_row = (size_t)HKV * D * e;
    ringattn_comm_t comm = NULL;
    if (!all_ok(api_ok("ringattn_comm_create_mpi", ringattn_comm_create_mpi(MPI_COMM_WORLD, &comm)))) {
        MPI_Finalize();
        return 2;
    }
    /* this rank's slots: positions [first, first + C); the prompt's are filled now */
    const int64_t first = (int64_t)rank_ * C;
    unsigned char *k = xmalloc((size_t)C * kv_row), *v = xmalloc((size_t)C * kv_row);
    for (int64_t p = first; p < first + C && p < o.prompt; ++p)
        fill_row(&o, K_OF, p, k, p - first), fill_row(&o, V_OF, p, v, p - first);
    unsigned char *q = xmalloc((size_t)H * D * e), *out = xmalloc((size_t)H * D * e);
    unsigned char *k_new = xmalloc(kv_row), *v_new = xmalloc(kv_row);
    float *lse = xmalloc(sizeof(float) * (size_t)H);
    int32_t *bounds = xmalloc(sizeof(int32_t) * (size_t)(ranks_ + 1));
    double *call_ms = xmalloc(sizeof(double) * (size_t)o.tokens);
    double *ro = xmalloc(sizeof(double) * (size_t)H * D), *po = xmalloc(sizeof(double) * (size_t)H * D);
    double *go = xmalloc(sizeof(double) * (size_t)H * D), rl[1024], pl[1024], gl[1024];
    if (rank_ == 0)
        printf("# ringattn %s decode: %d ranks x %d threads, heads %d/%d, D %d, %s, %s; prompt %d, "
               "%d tokens, %d slots per rank (filled rank by rank)\n"
               "%6s %8s %8s %8s %10s %12s %10s %9s %9s\n",
               ringattn_version_string(), ranks_, threads, H, HKV, D, dtype_name(o.dtype),
               o.window > 0 ? "sliding window" : "causal", o.prompt, o.tokens, C, "step", "cache",
               "plan_ms", "call_ms", "moved_B", "cache_B", "moved/cache", "err_O", "err_LSE");
    int ok = H <= 1024, wrong = 0;
    size_t moved_total = 0;
    for (int s = 0; ok && s < o.tokens; ++s) {
        const int64_t t = (int64_t)o.prompt + s; /* the new token's position; the cache holds t */
        for (int r = 0; r <= ranks_; ++r) bounds[r] = (int32_t)((int64_t)r * C < t ? (int64_t)r * C : t);
        const int32_t cu_q[2] = {0, 1}, cu_k[2] = {0, (int32_t)t}, cu_new[2] = {0, 1};
        ringattn_plan_desc_t d = RINGATTN_PLAN_DESC_INIT;
        d.num_heads = H, d.num_kv_heads = HKV, d.head_dim = D, d.dtype = o.dtype;
        d.num_seqs = 1, d.cu_seqlens = cu_q, d.cu_seqlens_k = cu_k, d.num_threads = threads;
        d.causal = 1, d.window_left = o.window > 0 ? o.window - 1 : -1;
        d.sharded_cache = 1, d.cache_bounds = bounds, d.cu_seqlens_new = cu_new;
        MPI_Barrier(MPI_COMM_WORLD); /* rank 0's checks of the last step are not plan time */
        double t0 = now();
        ringattn_plan_t plan = NULL;
        ok = all_ok(api_ok("ringattn_plan_create", ringattn_plan_create(comm, &d, &plan)));
        double times[2] = {now() - t0, 0.0};
        if (!ok) break;
        fill_row(&o, Q_OF, t, q, 0), fill_row(&o, K_OF, t, k_new, 0), fill_row(&o, V_OF, t, v_new, 0);
        ringattn_tensors_t ts = RINGATTN_TENSORS_INIT;
        ts.q.data = q, ts.k.data = k, ts.v.data = v, ts.o.data = out, ts.lse = lse;
        ts.k_new.data = k_new, ts.v_new.data = v_new;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        ok = all_ok(api_ok("ringattn_forward", ringattn_forward(plan, &ts, NULL)));
        times[1] = now() - t0;
        ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
        ringattn_plan_get_info(plan, &info);
        ringattn_plan_destroy(plan);
        MPI_Allreduce(MPI_IN_PLACE, times, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        unsigned long long moved = info.forward_bytes_sent;
        MPI_Allreduce(MPI_IN_PLACE, &moved, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        moved_total += moved;
        call_ms[s] = 1e3 * times[1];
        if (t / C == rank_) /* the owner of slot t appends the token */
            fill_row(&o, K_OF, t, k, t - first), fill_row(&o, V_OF, t, v, t - first);
        if (rank_ != 0 || !ok || (s % o.check_every && s != o.tokens - 1)) continue;
        const int64_t lo = o.window > 0 && t + 1 > o.window ? t + 1 - o.window : 0;
        reference(&o, t + 1, lo, 0, ro, rl);
        reference(&o, t + 1, lo, 1, po, pl);
        for (int i = 0; i < H * D; ++i) go[i] = load(out, o.dtype, i);
        for (int h = 0; h < H; ++h) gl[h] = lse[h];
        double eo, el, peo, pel;
        errors(&o, ro, rl, go, gl, &eo, &el);
        errors(&o, ro, rl, po, pl, &peo, &pel);
        const int good = spec9_verdict("O", eo, peo, 1e-5, o.dtype, 0) &&
                         spec9_verdict("LSE", el, pel, 1e-5, o.dtype, 0);
        wrong += !good;
        const double cache_bytes = (double)t * 2 * kv_row;
        printf("%6d %8lld %8.3f %8.3f %10llu %12.0f %10.2e %9.2e %9.2e%s\n", s, (long long)t,
               1e3 * times[0], 1e3 * times[1], moved, cache_bytes, (double)moved / cache_bytes, eo,
               el, good ? "" : "  WRONG");
        fflush(stdout);
    }
    if (rank_ == 0 && ok) {
        double sum = 0;
        for (int s = 0; s < o.tokens; ++s) sum += call_ms[s];
        printf("# %d tokens: %.3f ms per token on average (%.1f tokens/s), %.0f bytes moved per "
               "token (all ranks), %s\n",
               o.tokens, sum / o.tokens, 1e3 * o.tokens / sum, (double)moved_total / o.tokens,
               wrong ? "SOME ERRORS ABOVE TOLERANCE" : "every checked token within SPEC 9");
    }
    MPI_Bcast(&wrong, 1, MPI_INT, 0, MPI_COMM_WORLD);
    free(k), free(v), free(q), free(out), free(k_new), free(v_new), free(lse), free(bounds);
    free(call_ms), free(ro), free(po), free(go);
    ringattn_comm_destroy(comm);
    MPI_Finalize();
    return !ok ? 2 : wrong ? 1 : 0;
}
