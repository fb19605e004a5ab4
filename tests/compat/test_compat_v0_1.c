/*
 * A program built against the 0.1 header (tests/compat/v0_1/ringattn.h, a copy of it) runs on
 * this library: ringattn.h's struct_size policy. Its descriptor and info structs are smaller;
 * the fields added since take their defaults, and the info call writes only the fields the old
 * struct has. The old descriptor's trailing padding (where a later field now sits) is filled
 * with garbage here: the library must not read it. A struct_size from a "later version" is
 * refused. Forward outputs are checked against a float64 computation.
 */
#include "ringattn.h" /* the 0.1 header: this directory is first on the include path */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if RINGATTN_VERSION != 100
#error "test_compat_v0_1 must be compiled against the 0.1 header"
#endif

enum { H = 2, D = 16, T = 50 };
static const int32_t cu[] = {0, 20, 50};

static int failures;
#define EXPECT(cond, ...)                                                                        \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            ++failures;                                                                          \
            printf("FAIL line %d: ", __LINE__);                                                  \
            printf(__VA_ARGS__);                                                                 \
            printf(" (%s)\n", ringattn_last_error());                                          \
        }                                                                                        \
    } while (0)

/* A 0.1 descriptor set field by field over garbage, so its padding bytes stay garbage. */
static void old_desc(ringattn_plan_desc_t *d)
{
    memset(d, 0x7f, sizeof *d);
    d->struct_size = sizeof *d;
    d->num_heads = H, d->num_kv_heads = 0, d->head_dim = D, d->head_dim_v = 0;
    d->dtype = RINGATTN_FLOAT32, d->layout = RINGATTN_LAYOUT_CONTIGUOUS;
    d->num_seqs = 2, d->cu_seqlens = cu, d->cu_seqlens_k = NULL;
    d->causal = 1, d->window_left = -1, d->window_right = -1;
    d->softmax_scale = 0.0f, d->softcap = 0.0f, d->alibi_slopes = NULL;
    d->key_bias_heads = 0, d->keep_k = 0, d->block_q = 8, d->block_k = 8, d->num_threads = 1;
}

static float frand(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* max |O - float64 causal attention| over the batch. */
static double forward_error(const float *q, const float *k, const float *v, const float *o)
{
    double worst = 0.0;
    for (int s = 0; s < 2; ++s)
        for (int t = cu[s]; t < cu[s + 1]; ++t)
            for (int h = 0; h < H; ++h) {
                double m = -INFINITY, l = 0.0, acc[D] = {0}, z[T];
                for (int j = cu[s]; j <= t; ++j) {
                    z[j] = 0.0;
                    for (int c = 0; c < D; ++c)
                        z[j] += (double)q[(t * H + h) * D + c] * k[(j * H + h) * D + c];
                    z[j] /= sqrt((double)D);
                    m = z[j] > m ? z[j] : m;
                }
                for (int j = cu[s]; j <= t; ++j) {
                    const double p = exp(z[j] - m);
                    l += p;
                    for (int c = 0; c < D; ++c) acc[c] += p * v[(j * H + h) * D + c];
                }
                for (int c = 0; c < D; ++c) {
                    const double e = fabs(acc[c] / l - o[(t * H + h) * D + c]);
                    worst = e > worst ? e : worst;
                }
            }
    return worst;
}

int main(void)
{
    printf("header %d, library %d (%s)\n", RINGATTN_VERSION, ringattn_version(),
           ringattn_version_string());
    EXPECT(ringattn_version() > RINGATTN_VERSION, "the library is newer than the 0.1 header");

    ringattn_plan_desc_t d;
    old_desc(&d);
    ringattn_plan_t plan = NULL;
    EXPECT(ringattn_plan_create(NULL, &d, &plan) == RINGATTN_SUCCESS, "0.1 descriptor accepted");
    if (!plan) return 1;

    /* The 0.1 info struct, followed by bytes that must stay as they are. */
    struct {
        ringattn_plan_info_t info;
        unsigned char guard[64];
    } out;
    memset(&out, 0xa5, sizeof out);
    const ringattn_plan_info_t init = RINGATTN_PLAN_INFO_INIT;
    out.info = init;
    EXPECT(ringattn_plan_get_info(plan, &out.info) == RINGATTN_SUCCESS, "0.1 info accepted");
    EXPECT(out.info.struct_size == sizeof out.info, "struct_size kept");
    EXPECT(out.info.ranks == 1 && out.info.local_tokens == T, "info fields: ranks %d tokens %lld",
           out.info.ranks, (long long)out.info.local_tokens);
    int guard_ok = 1;
    for (size_t i = 0; i < sizeof out.guard; ++i) guard_ok = guard_ok && out.guard[i] == 0xa5;
    EXPECT(guard_ok, "nothing written past the 0.1 info struct");

    static float q[T * H * D], k[T * H * D], v[T * H * D], o[T * H * D], lse[H * T];
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < T * H * D; ++i) q[i] = frand(&seed), k[i] = frand(&seed), v[i] = frand(&seed);
    for (int i = 0; i < T * H * D; ++i) o[i] = NAN;
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = q, t.k.data = k, t.v.data = v, t.o.data = o, t.lse = lse;
    EXPECT(ringattn_forward(plan, &t, NULL) == RINGATTN_SUCCESS, "forward with 0.1 structs");
    const double err = forward_error(q, k, v, o);
    printf("forward max |O - float64| = %.3g\n", err);
    EXPECT(err <= 1e-5, "forward error %.3g", err);
    ringattn_plan_destroy(plan);

    /* A later version's larger structs are refused, not misread. */
    old_desc(&d);
    d.struct_size = sizeof d + 64;
    plan = NULL;
    EXPECT(ringattn_plan_create(NULL, &d, &plan) == RINGATTN_ERR_INVALID_ARGUMENT && !plan,
           "a descriptor larger than any release refused");
    out.info = init;
    out.info.struct_size = sizeof out.info + 8;
    old_desc(&d);
    EXPECT(ringattn_plan_create(NULL, &d, &plan) == RINGATTN_SUCCESS, "plan again");
    EXPECT(ringattn_plan_get_info(plan, &out.info) == RINGATTN_ERR_INVALID_ARGUMENT,
           "an info struct_size of no release refused");
    ringattn_plan_destroy(plan);

    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
