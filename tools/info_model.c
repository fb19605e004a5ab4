/* ringattn-info's link model lines and table (tools/info.h; the model: tools/link_model.h). */
#include <stdio.h>
#include <string.h>

#include "info.h"

/* P_u that ringattn.h allows for P ranks, H and H_kv heads. */
static int allowed(const ringattn_plan_desc_t *d, int P, int pu)
{
    const int H = d->num_heads, Hk = d->num_kv_heads ? d->num_kv_heads : H;
    return P % pu == 0 && H % pu == 0 && (Hk % pu == 0 || pu % Hk == 0);
}

static void estimate_of(const lm_params_t *m, const ringattn_plan_desc_t *d,
                        const ringattn_plan_info_t *info, double flops, lm_estimate_t *e)
{
    lm_estimate(m, info, info->ulysses_size > 1 && d->ulysses_strided, flops, e);
}

void info_model_rank(const lm_params_t *m, const ringattn_plan_desc_t *d,
                     const ringattn_plan_info_t *info)
{
    const double flops = lm_rank_flops(d, info->ranks, info->rank);
    if (flops < 0) {
        printf("    model: no estimate: %s\n", ringattn_last_error());
        return;
    }
    lm_estimate_t e;
    estimate_of(m, d, info, flops, &e);
    for (int b = 0; b < 2; ++b)
        printf("    model %s: %.3f ms = all-to-all %.3f + ring %.3f (compute %.3f, exchanges "
               "%.3f, exposed %.3f)%s\n",
               b ? "backward" : "forward ", e.call_ms[b], e.a2a_ms[b], e.ring_ms[b],
               e.compute_ms[b], e.ring_comm_ms[b], e.exposed_ms[b], b ? "" : ";");
    printf("    model step %.3f ms; %.4g GFLOP forward; the ring's link: %s; %d of the group on "
           "other nodes\n",
           e.step_ms, flops * 1e-9, e.ring_remote ? "inter-node" : "intra-node", e.a2a_remote);
}

/* The plan of `rank` of a simulated world of P ranks and its estimate; 0 and the message in
   err when refused. */
static int estimate_rank(const lm_params_t *m, const ringattn_plan_desc_t *d, int P, int rank,
                         ringattn_plan_info_t *info, lm_estimate_t *e, char *err, size_t n)
{
    ringattn_comm_t comm = NULL;
    ringattn_plan_t plan = NULL;
    ringattn_status_t st = P > 1 ? ringattn_comm_create_simulated(rank, P, &comm) : RINGATTN_SUCCESS;
    if (st == RINGATTN_SUCCESS) st = ringattn_plan_create(comm, d, &plan);
    *info = (ringattn_plan_info_t)RINGATTN_PLAN_INFO_INIT;
    if (st == RINGATTN_SUCCESS) st = ringattn_plan_get_info(plan, info);
    const double flops = st == RINGATTN_SUCCESS ? lm_rank_flops(d, P, rank) : -1.0;
    if (flops < 0) snprintf(err, n, "%s", ringattn_last_error());
    ringattn_plan_destroy(plan);
    ringattn_comm_destroy(comm);
    if (flops < 0) return 0;
    estimate_of(m, d, info, flops, e);
    return 1;
}

static void header(const lm_params_t *m, const ringattn_plan_desc_t *d, int P, int rank, int csv)
{
    static const char *const dtypes[] = {"f32", "f16", "bf16"}, *const layouts[] = {"contiguous", "zigzag", "striped"};
    const int64_t T = d->cu_seqlens[d->num_seqs];
    char mask[64];
    if (d->window_left >= 0 || (!d->causal && d->window_right >= 0))
        snprintf(mask, sizeof mask, "window %d,%d", d->window_left, d->causal ? 0 : d->window_right);
    else snprintf(mask, sizeof mask, "%s", d->causal ? "causal" : "none");
    char who[64];
    if (rank >= 0) snprintf(who, sizeof who, "rank %d (--rank all: the slowest)", rank);
    else snprintf(who, sizeof who, "the slowest of ranks 0-%d", P - 1);
    printf("%sshape: T %lld in %d seq(s), heads %d/%d, dims %d/%d, %s, %s, layout %s; P %d%s; %s\n",
           csv ? "# " : "model: ", (long long)T, d->num_seqs, d->num_heads,
           d->num_kv_heads ? d->num_kv_heads : d->num_heads, d->head_dim,
           d->head_dim_v ? d->head_dim_v : d->head_dim, dtypes[d->dtype], mask,
           layouts[d->layout], P, d->ulysses_strided ? ", strided groups" : "", who);
    lm_print_params(stdout, csv ? "# " : "", m);
    if (csv) {
        printf("ranks,per_node,ulysses,ring,rank,ring_steps,a2a_fwd_sent,a2a_fwd_received,"
               "a2a_bwd_sent,a2a_bwd_received,ring_fwd_sent,ring_fwd_received,ring_bwd_sent,"
               "ring_bwd_received,a2a_fwd_ms,a2a_bwd_ms,ring_comm_fwd_ms,ring_comm_bwd_ms,"
               "exposed_fwd_ms,exposed_bwd_ms,compute_fwd_ms,compute_bwd_ms,fwd_ms,bwd_ms,"
               "step_ms\n");
        return;
    }
    printf("model: bytes per call max(sent, received) in MB (1e6); times in ms, forward + "
           "backward; exposed = ring time not hidden behind compute\n");
    printf("  %-11s %5s %19s %19s %9s %10s %9s %10s %10s\n", "P_u x P_r", "steps",
           "a2a MB fwd / bwd", "ring MB fwd / bwd", "a2a", "ring comm", "exposed", "compute",
           "step");
}

static double mb(size_t a, size_t b) { return (a > b ? a : b) * 1e-6; }

static void row(const lm_params_t *m, int P, int rank, const ringattn_plan_info_t *i,
                const lm_estimate_t *e, int csv)
{
    const int pu = i->ulysses_size > 1 ? i->ulysses_size : 1;
    if (csv) {
        printf("%d,%d,%d,%d,%d,%d,%zu,%zu,%zu,%zu,%zu,%zu,%zu,%zu,%.6g,%.6g,%.6g,%.6g,%.6g,"
               "%.6g,%.6g,%.6g,%.6g,%.6g,%.6g\n",
               P, m->per_node, pu, P / pu, rank, i->num_steps, i->alltoall_forward_bytes_sent,
               i->alltoall_forward_bytes_received, i->alltoall_backward_bytes_sent,
               i->alltoall_backward_bytes_received, i->forward_bytes_sent,
               i->forward_bytes_received, i->backward_bytes_sent, i->backward_bytes_received,
               e->a2a_ms[0], e->a2a_ms[1], e->ring_comm_ms[0], e->ring_comm_ms[1],
               e->exposed_ms[0], e->exposed_ms[1], e->compute_ms[0], e->compute_ms[1],
               e->call_ms[0], e->call_ms[1], e->step_ms);
        return;
    }
    char grid[32], a2a[32], ring[32];
    snprintf(grid, sizeof grid, "%d x %d", pu, P / pu);
    snprintf(a2a, sizeof a2a, "%.1f / %.1f",
             mb(i->alltoall_forward_bytes_sent, i->alltoall_forward_bytes_received),
             mb(i->alltoall_backward_bytes_sent, i->alltoall_backward_bytes_received));
    snprintf(ring, sizeof ring, "%.1f / %.1f", mb(i->forward_bytes_sent, i->forward_bytes_received),
             mb(i->backward_bytes_sent, i->backward_bytes_received));
    printf("  %-11s %5d %19s %19s %9.3f %10.3f %9.3f %10.3f %10.3f\n", grid, i->num_steps, a2a,
           ring, e->a2a_ms[0] + e->a2a_ms[1], e->ring_comm_ms[0] + e->ring_comm_ms[1],
           e->exposed_ms[0] + e->exposed_ms[1], e->compute_ms[0] + e->compute_ms[1], e->step_ms);
}

int info_model_table(const lm_params_t *m, const ringattn_plan_desc_t *desc, int P, int rank,
                     int csv)
{
    header(m, desc, P, rank, csv);
    int rows = 0;
    char err[512] = "";
    for (int pu = 1; pu <= P; ++pu) {
        if (!allowed(desc, P, pu)) continue;
        ringattn_plan_desc_t d = *desc;
        d.ulysses_size = pu;
        ringattn_plan_info_t info, slow_info = RINGATTN_PLAN_INFO_INIT;
        lm_estimate_t e, slow;
        memset(&slow, 0, sizeof slow);
        int slowest = -1, ok = 1;
        for (int r = rank >= 0 ? rank : 0; ok && r < (rank >= 0 ? rank + 1 : P); ++r) {
            ok = estimate_rank(m, &d, P, r, &info, &e, err, sizeof err);
            if (ok && (slowest < 0 || e.step_ms > slow.step_ms)) slowest = r, slow = e, slow_info = info;
        }
        if (!ok) {
            printf("%s  %d x %d: refused: %s\n", csv ? "#" : "", pu, P / pu, err);
            continue;
        }
        row(m, P, slowest, &slow_info, &slow, csv);
        ++rows;
    }
    if (!rows) fprintf(stderr, "ringattn-info: --model: no P_u gave a plan%s%s\n", err[0] ? ": " : "", err);
    return rows ? 0 : 2;
}
