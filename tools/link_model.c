/* The link model of tools/link_model.h (what it estimates and from what is said there). Only
   the public API: the plan of a rank's group is made over a simulated comm. */
#include "link_model.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

const char lm_usage[] =
    "model: [--intra-gbs GB/s] [--inter-gbs GB/s] [--intra-lat-us US] [--inter-lat-us US]\n"
    "       [--tflops TF] [--tflops-bwd TF] [--per-node N]   (defaults: NVLink 4 450 GB/s and\n"
    "       3 us, 400 Gb/s InfiniBand 50 GB/s and 5 us per GPU, 400 TFLOP/s attention per GPU\n"
    "       (assumed), 8 GPUs a node)\n";

int lm_parse_flag(const char *prog, const char *flag, const char *value, lm_params_t *m)
{
    static const struct {
        const char *name;
        size_t at;
        int positive; /* a bandwidth or rate: > 0; a latency may be 0 */
    } flags[] = {
        {"--intra-gbs", offsetof(lm_params_t, intra_gbs), 1},
        {"--inter-gbs", offsetof(lm_params_t, inter_gbs), 1},
        {"--intra-lat-us", offsetof(lm_params_t, intra_lat_us), 0},
        {"--inter-lat-us", offsetof(lm_params_t, inter_lat_us), 0},
        {"--tflops", offsetof(lm_params_t, tflops), 1},
        {"--tflops-bwd", offsetof(lm_params_t, tflops_bwd), 1},
    };
    if (!strcmp(flag, "--per-node")) {
        char *end = NULL;
        const long n = value ? strtol(value, &end, 10) : 0;
        if (!value || *end || end == value || n < 1 || n > 1 << 20) {
            fprintf(stderr, "%s: --per-node %s: expected a whole number of GPUs >= 1\n", prog,
                    value ? value : "(missing)");
            return -1;
        }
        m->per_node = (int)n;
        return 1;
    }
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; ++i) {
        if (strcmp(flag, flags[i].name)) continue;
        char *end = NULL;
        const double v = value ? strtod(value, &end) : -1.0;
        if (!value || *end || end == value || !(v >= 0.0 && v < 1e12) || (flags[i].positive && v == 0.0)) {
            fprintf(stderr, "%s: %s %s: expected a number %s\n", prog, flag,
                    value ? value : "(missing)", flags[i].positive ? "> 0" : ">= 0");
            return -1;
        }
        *(double *)((char *)m + flags[i].at) = v;
        return 1;
    }
    return 0;
}

void lm_print_params(FILE *f, const char *prefix, const lm_params_t *m)
{
    fprintf(f, "%slink model (an estimate): intra-node %g GB/s, %g us; inter-node %g GB/s, %g us (per GPU "
               "and direction); %g TFLOP/s forward, %g backward per GPU (assumed); %d GPUs a node\n",
            prefix, m->intra_gbs, m->intra_lat_us, m->inter_gbs, m->inter_lat_us, m->tflops,
            m->tflops_bwd > 0 ? m->tflops_bwd : m->tflops, m->per_node);
}

double lm_pairs(const ringattn_plan_desc_t *d, const int32_t *tokens, int64_t n)
{
    const int32_t *cq = d->cu_seqlens, *ck = d->cu_seqlens_k ? d->cu_seqlens_k : d->cu_seqlens;
    const int right = d->causal ? 0 : d->window_right;
    double pairs = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        int lo = 0, hi = d->num_seqs - 1; /* the sequence of token i: cq[s] <= g < cq[s + 1] */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (cq[mid] <= tokens[i]) lo = mid;
            else hi = mid - 1;
        }
        const int64_t lq = cq[lo + 1] - cq[lo], lk = ck[lo + 1] - ck[lo];
        const int64_t diag = tokens[i] - cq[lo] + lk - lq; /* bottom-right aligned (SPEC 3) */
        int64_t first = d->window_left >= 0 ? diag - d->window_left : 0;
        int64_t last = right >= 0 ? diag + right : lk - 1;
        first = first < 0 ? 0 : first, last = last > lk - 1 ? lk - 1 : last;
        pairs += last >= first ? (double)(last - first + 1) : 0.0;
    }
    return pairs;
}

double lm_rank_flops(const ringattn_plan_desc_t *desc, int P, int rank)
{
    const int pu = desc->ulysses_size > 1 ? desc->ulysses_size : 1, pr = P / pu;
    /* the rank's group: consecutive groups g = rank / P_u, strided g = rank % P_r */
    const int group = pu > 1 && desc->ulysses_strided ? rank % pr : rank / pu;
    ringattn_plan_desc_t d = *desc;
    d.ulysses_size = 0, d.ulysses_strided = 0, d.backend = RINGATTN_BACKEND_CPU, d.device = -1;
    ringattn_comm_t comm = NULL;
    ringattn_plan_t plan = NULL;
    if (pr > 1 && ringattn_comm_create_simulated(group, pr, &comm) != RINGATTN_SUCCESS) return -1.0;
    double flops = -1.0;
    int64_t n = 0;
    if (ringattn_plan_create(comm, &d, &plan) == RINGATTN_SUCCESS &&
        ringattn_plan_local_tokens(plan, &n, NULL) == RINGATTN_SUCCESS) {
        int32_t *tokens = malloc((size_t)(n ? n : 1) * sizeof *tokens);
        if (tokens && ringattn_plan_local_tokens(plan, &n, tokens) == RINGATTN_SUCCESS) {
            const double dv = desc->head_dim_v ? desc->head_dim_v : desc->head_dim;
            flops = 2.0 * (desc->head_dim + dv) * lm_pairs(desc, tokens, n) * (desc->num_heads / pu);
        }
        free(tokens);
    }
    ringattn_plan_destroy(plan);
    ringattn_comm_destroy(comm);
    return flops;
}

static double ms(double bytes, double gbs) { return bytes / (gbs * 1e9) * 1e3; }
static double most(double a, double b) { return a > b ? a : b; }

/* Where the rank's group and ring sit on the nodes (ringattn.h: ulysses_size, _strided). */
static void placement(const lm_params_t *m, const ringattn_plan_info_t *in, int strided,
                      lm_estimate_t *e)
{
    const int r = in->rank, pu = in->ulysses_size > 1 ? in->ulysses_size : 1;
    const int pr = in->ranks / pu, node = r / m->per_node;
    const int group = strided ? r % pr : r / pu, place = strided ? r / pr : r % pu;
    for (int k = 0; k < pu; ++k) { /* member k of the group */
        const int x = strided ? group + k * pr : group * pu + k;
        e->a2a_remote += x != r && x / m->per_node != node;
    }
    for (int i = 0; i < pr && pr > 1; ++i) { /* the hop from the ring's i-th rank to the next */
        const int a = strided ? place * pr + i : i * pu + place;
        const int j = (i + 1) % pr, b = strided ? place * pr + j : j * pu + place;
        e->ring_remote |= a / m->per_node != b / m->per_node;
    }
}

void lm_estimate(const lm_params_t *m, const ringattn_plan_info_t *in, int strided,
                 double fwd_flops, lm_estimate_t *e)
{
    memset(e, 0, sizeof *e);
    placement(m, in, strided, e);
    const int pu = in->ulysses_size > 1 ? in->ulysses_size : 1;
    const double a2a[2] = {most((double)in->alltoall_forward_bytes_sent, (double)in->alltoall_forward_bytes_received),
                           most((double)in->alltoall_backward_bytes_sent, (double)in->alltoall_backward_bytes_received)};
    const double ring[2] = {most((double)in->forward_bytes_sent, (double)in->forward_bytes_received),
                            most((double)in->backward_bytes_sent, (double)in->backward_bytes_received)};
    const double rates[2] = {m->tflops, m->tflops_bwd > 0 ? m->tflops_bwd : m->tflops};
    const double far = pu > 1 ? (double)e->a2a_remote / (pu - 1) : 0.0;
    const double ring_gbs = e->ring_remote ? m->inter_gbs : m->intra_gbs;
    const double ring_lat = e->ring_remote ? m->inter_lat_us : m->intra_lat_us;
    /* a rank that computes in no step still computes (its FLOPs say so): count one step */
    const int n = in->num_steps > 1 ? in->num_steps : 1, k = in->compute_steps > 1 ? in->compute_steps : 1;
    for (int b = 0; b < 2; ++b) {
        e->compute_ms[b] = fwd_flops * (b ? 2.5 : 1.0) / (rates[b] * 1e12) * 1e3;
        if (pu > 1)
            e->a2a_ms[b] = most(ms(a2a[b] * (1.0 - far), m->intra_gbs), ms(a2a[b] * far, m->inter_gbs)) +
                           2.0 * (pu - 1) * (e->a2a_remote ? m->inter_lat_us : m->intra_lat_us) * 1e-3;
        const double x = n > 1 && ring[b] > 0 ? ms(ring[b] / (n - 1), ring_gbs) + ring_lat * 1e-3 : 0.0;
        const double c = e->compute_ms[b] / k;
        e->ring_comm_ms[b] = x * (n - 1);
        for (int s = 0; s < n; ++s) /* step s's compute hides the exchange for step s + 1 */
            e->ring_ms[b] += s < n - 1 ? most(s < k ? c : 0.0, x) : (s < k ? c : 0.0);
        e->exposed_ms[b] = e->ring_ms[b] - e->compute_ms[b];
        if (e->exposed_ms[b] < 1e-9 * e->ring_ms[b]) e->exposed_ms[b] = 0.0; /* rounding alone */
        e->call_ms[b] = e->a2a_ms[b] + e->ring_ms[b];
    }
    e->step_ms = e->call_ms[0] + e->call_ms[1];
}
