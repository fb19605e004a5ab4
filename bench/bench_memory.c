/*
 * bench_memory: what a single-rank plan holds beyond its tensors, in resident memory (RSS, read
 * from /proc/self/statm), for a forward-only use and after a backward. Issue 28: the CPU
 * backend's backward dK/dV slots, ranges x key rows x H_kv x (D + D_v) floats, were made at plan
 * creation: +130 MiB of a forward-only plan at T = 32K.
 *
 * For each T: the tensors (Q, K, V, O, LSE; then dO, dQ, dK, dV) are allocated and touched, a
 * plan is made and runs one forward, then one backward; the RSS above the tensors is printed
 * after each, with the plan's own account (ringattn_plan_get_info memory_bytes). One-time costs
 * of the process (OpenMP's threads, the BLAS) are paid by a small warm-up plan first.
 *
 *   bench_memory [--seq LIST] [--heads H] [--kv-heads HKV] [--dim D] [--threads N] [--json FILE]
 *
 * Defaults: --seq 32768 --heads 8 --kv-heads 2 --dim 128, causal, float32, OpenMP's threads. JSON
 * lines (one per T) on stdout after the table, or in FILE.
 */
#define _POSIX_C_SOURCE 200809L
#include <ringattn.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BENCH_NAME "bench_memory"
#include "common.h"

static double rss_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (!f || fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    if (f) fclose(f);
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

typedef struct {
    int T, H, HKV, D, threads;
    double tensors, fwd_tensors, plan_made, after_forward, after_backward; /* MiB */
    double info_forward, info_backward;                                    /* MiB */
    int ok;
} row_t;

static void fill(float *x, int64_t n, uint64_t *seed) {
    for (int64_t i = 0; i < n; ++i) x[i] = (float)(unit(seed) * 2.0 - 1.0);
}

static double info_mib(ringattn_plan_t plan) {
    ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
    return ringattn_plan_get_info(plan, &info) == RINGATTN_SUCCESS
               ? (double)info.memory_bytes / (1024.0 * 1024.0)
               : -1.0;
}

/* One T: RSS above the process's state before its tensors. */
static row_t measure(int T, int H, int HKV, int D, int threads) {
    row_t r = {T, H, HKV, D, threads, 0, 0, 0, 0, 0, 0, 0, 1};
    const double base = rss_mib();
    uint64_t seed = 28;
    const int64_t nq = (int64_t)T * H * D, nk = (int64_t)T * HKV * D;
    float *q = touched_floats(nq), *k = touched_floats(nk), *v = touched_floats(nk);
    float *o = touched_floats(nq), *lse = touched_floats((int64_t)H * T);
    fill(q, nq, &seed), fill(k, nk, &seed), fill(v, nk, &seed);
    r.fwd_tensors = rss_mib() - base;
    float *dout = touched_floats(nq), *dq = touched_floats(nq), *dk = touched_floats(nk),
          *dv = touched_floats(nk);
    fill(dout, nq, &seed);
    r.tensors = rss_mib() - base;
    const int32_t cu[2] = {0, T};
    ringattn_plan_desc_t d = one_sequence_desc(cu, H, HKV, D, threads);
    d.causal = 1;
    ringattn_plan_t plan = NULL;
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = q, t.k.data = k, t.v.data = v, t.o.data = o, t.lse = lse;
    t.dout.data = dout, t.dq.data = dq, t.dk.data = dk, t.dv.data = dv;
    if (ringattn_plan_create(NULL, &d, &plan) != RINGATTN_SUCCESS) {
        fprintf(stderr, BENCH_NAME ": %s\n", ringattn_last_error());
        r.ok = 0;
        return r;
    }
    r.plan_made = rss_mib() - base - r.tensors;
    r.ok = ringattn_forward(plan, &t, NULL) == RINGATTN_SUCCESS && all_finite(o, nq);
    r.after_forward = rss_mib() - base - r.tensors;
    r.info_forward = info_mib(plan);
    r.ok = r.ok && ringattn_backward(plan, &t, NULL) == RINGATTN_SUCCESS && all_finite(dq, nq);
    r.after_backward = rss_mib() - base - r.tensors;
    r.info_backward = info_mib(plan);
    if (!r.ok) fprintf(stderr, BENCH_NAME ": T %d: %s\n", T, ringattn_last_error());
    ringattn_plan_destroy(plan);
    for (float *x[] = {q, k, v, o, lse, dout, dq, dk, dv}, **p = x; p < x + 9; ++p) free(*p);
    return r;
}

int main(int argc, char **argv) {
    int seqs[16] = {32768}, nseqs = 1, H = 8, HKV = 2, D = 128, threads = 0;
    const char *json_path = NULL;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--seq") && next) {
            nseqs = 0;
            for (char *s = argv[++i], *tok; (tok = strtok(s, ",")) && nseqs < 16; s = NULL)
                seqs[nseqs++] = atoi(tok);
        } else if (!strcmp(a, "--heads") && next) H = atoi(argv[++i]);
        else if (!strcmp(a, "--kv-heads") && next) HKV = atoi(argv[++i]);
        else if (!strcmp(a, "--dim") && next) D = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && next) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--json") && next) json_path = argv[++i];
        else {
            fprintf(stderr, "usage: bench_memory [--seq LIST] [--heads H] [--kv-heads HKV] "
                            "[--dim D] [--threads N] [--json FILE]\n");
            return 2;
        }
    }
    (void)measure(256, H, HKV, D, threads); /* warm-up: OpenMP's threads, the BLAS */
    printf("# bench_memory: ringattn %s, RSS in MiB above the tensors (float32, causal, one rank)\n",
           ringattn_version_string());
    printf("%7s %5s %4s %4s %10s %10s %10s %10s %10s %11s %11s\n", "seq", "heads", "kv", "dim",
           "tensors", "fwd-tensor", "plan", "+forward", "+backward", "info(fwd)", "info(bwd)");
    row_t rows[16];
    int failed = 0;
    for (int i = 0; i < nseqs; ++i) {
        rows[i] = measure(seqs[i], H, HKV, D, threads);
        const row_t *r = &rows[i];
        failed |= !r->ok;
        printf("%7d %5d %4d %4d %10.1f %10.1f %10.1f %10.1f %10.1f %11.1f %11.1f\n", r->T, r->H,
               r->HKV, r->D, r->tensors, r->fwd_tensors, r->plan_made, r->after_forward,
               r->after_backward, r->info_forward, r->info_backward);
    }
    FILE *json = json_path ? fopen(json_path, "w") : stdout;
    for (int i = 0; json && i < nseqs; ++i) {
        const row_t *r = &rows[i];
        fprintf(json,
                "{\"bench\":\"memory\",\"seq\":%d,\"heads\":%d,\"kv_heads\":%d,\"dim\":%d,"
                "\"tensors_mib\":%.2f,\"plan_mib\":%.2f,\"forward_mib\":%.2f,"
                "\"backward_mib\":%.2f,\"info_forward_mib\":%.2f,\"info_backward_mib\":%.2f,"
                "\"ok\":%d}\n",
                r->T, r->H, r->HKV, r->D, r->tensors, r->plan_made, r->after_forward,
                r->after_backward, r->info_forward, r->info_backward, r->ok);
    }
    if (json && json != stdout) fclose(json);
    return failed ? 1 : 0;
}
