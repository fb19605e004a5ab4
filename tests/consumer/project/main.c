/*
 * Consumer check: a program built against an *installed* ringattn (find_package or pkg-config).
 * Two packed sequences, GQA (4 query heads on 2 kv heads), causal sliding window: forward on
 * random data, every output checked against a direct float64 computation (SPEC 9 float32).
 */
#include <ringattn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { H = 4, HKV = 2, D = 32, WL = 15 };
static const int32_t cu[] = {0, 40, 77};
#define NSEQ 2
#define T 77

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* float64 attention for query row t, head h, of the sequence [s0, s1) */
static void reference(const float *q, const float *k, const float *v, int t, int h, int s0,
                      double *o, double *lse) {
    const int hk = h / (H / HKV);
    const double scale = 1.0 / sqrt((double)D);
    double m = -INFINITY, l = 0.0, acc[D] = {0};
    const int lo = t - WL > s0 ? t - WL : s0; /* causal, window (WL, 0), same sequence */
    for (int pass = 0; pass < 2; ++pass)
        for (int j = lo; j <= t; ++j) {
            double s = 0.0;
            for (int c = 0; c < D; ++c)
                s += (double)q[(t * H + h) * D + c] * (double)k[(j * HKV + hk) * D + c];
            s *= scale;
            if (pass == 0) {
                if (s > m) m = s;
                continue;
            }
            const double p = exp(s - m);
            l += p;
            for (int c = 0; c < D; ++c) acc[c] += p * (double)v[(j * HKV + hk) * D + c];
        }
    for (int c = 0; c < D; ++c) o[c] = acc[c] / l;
    *lse = m + log(l);
}

int main(void) {
    static float q[T * H * D], k[T * HKV * D], v[T * HKV * D], o[T * H * D], lse[H * T];
    for (int i = 0; i < T * H * D; ++i) q[i] = frand();
    for (int i = 0; i < T * HKV * D; ++i) k[i] = frand(), v[i] = frand();

    printf("ringattn %s (header %d, library %d)\n", ringattn_version_string(), RINGATTN_VERSION,
           ringattn_version());
    if (ringattn_version() / 10000 != RINGATTN_VERSION_MAJOR) {
        fprintf(stderr, "header/library major version mismatch\n");
        return 1;
    }

    ringattn_plan_desc_t desc = RINGATTN_PLAN_DESC_INIT;
    desc.num_heads = H;
    desc.num_kv_heads = HKV;
    desc.head_dim = D;
    desc.num_seqs = NSEQ;
    desc.cu_seqlens = cu;
    desc.causal = 1;
    desc.window_left = WL;
    ringattn_plan_t plan = NULL;
    ringattn_status_t st = ringattn_plan_create(NULL, &desc, &plan);
    if (st != RINGATTN_SUCCESS) {
        fprintf(stderr, "ringattn_plan_create: %s: %s\n", ringattn_status_string(st),
                ringattn_last_error());
        return 1;
    }
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = q;
    t.k.data = k;
    t.v.data = v;
    t.o.data = o;
    t.lse = lse;
    st = ringattn_forward(plan, &t, NULL);
    if (st != RINGATTN_SUCCESS) {
        fprintf(stderr, "ringattn_forward: %s: %s\n", ringattn_status_string(st),
                ringattn_last_error());
        ringattn_plan_destroy(plan);
        return 1;
    }
    ringattn_plan_destroy(plan);

    double err = 0.0, big = 0.0, lerr = 0.0, lbig = 0.0;
    for (int s = 0; s < NSEQ; ++s)
        for (int r = cu[s]; r < cu[s + 1]; ++r)
            for (int h = 0; h < H; ++h) {
                double ref[D], rlse;
                reference(q, k, v, r, h, cu[s], ref, &rlse);
                for (int c = 0; c < D; ++c) {
                    err = fmax(err, fabs((double)o[(r * H + h) * D + c] - ref[c]));
                    big = fmax(big, fabs(ref[c]));
                }
                lerr = fmax(lerr, fabs((double)lse[h * T + r] - rlse));
                lbig = fmax(lbig, fabs(rlse));
            }
    const double rel = err / big, lrel = lerr / lbig;
    printf("max rel error: O %.3g, LSE %.3g (tolerance 1e-5)\n", rel, lrel);
    if (!(rel <= 1e-5) || !(lrel <= 1e-5)) {
        fprintf(stderr, "FAILED: error above tolerance\n");
        return 1;
    }
    printf("ok\n");
    return 0;
}
