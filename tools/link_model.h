/*
 * link_model.h: the small model of a step's time that ringattn-info --model and bench_ring
 * --ulysses print (tools/link_model.c; bench/README.md, "The link model"). An estimate from a
 * plan's byte counts (ringattn_plan_get_info), the attention FLOPs of its rank and a few link
 * and compute parameters: never a measurement.
 *
 * A call of a 2D plan (P_u x P_r) is an all-to-all inside the group, the ring across groups,
 * and an all-to-all back; a flat ring is the ring alone. Per call (forward, backward apart):
 *   compute    4 D_mean pairs heads / rate, D_mean = (D + D_v) / 2: the attention FLOPs as
 *              FlashAttention counts them (2 (D + D_v) per allowed query-key pair and head; the
 *              backward 2.5 times that), pairs those the mask allows for the queries the rank
 *              attends (a 2D rank: its group's tokens, H / P_u heads)
 *   a2a        max(sent, received) / link bandwidth + 2 (P_u - 1) latency: the two all-to-alls
 *              of the call, each P_u - 1 messages, not overlapped with anything (they come
 *              before and after the ring). Bytes to members on other nodes go over the NIC,
 *              the rest over NVLink, at once: the slower of the two counts
 *   ring       per exchange x = max(sent, received) / (steps - 1) / bandwidth + latency, and
 *              the ring is sum over steps s < n-1 of max(c_s, x) + c_{n-1}: each exchange hides
 *              behind the step's compute (c = compute / computing steps, the empty steps
 *              last). The link is the NIC if any hop of the rank's ring leaves its node, else
 *              NVLink: ranks step together, so the slowest hop sets the pace
 * Ranks are placed per_node to a node in order (rank r on node r / per_node); each GPU has its
 * own NIC (bandwidths are per GPU and direction). Not modelled: contention between the links,
 * kernel launch and synchronisation overheads, imbalance between ranks (ringattn-info --rank
 * all takes the slowest), the key bias and top-k.
 */
#ifndef RINGATTN_TOOLS_LINK_MODEL_H
#define RINGATTN_TOOLS_LINK_MODEL_H

#include <ringattn.h>

#include <stdint.h>
#include <stdio.h>

typedef struct {
    double intra_gbs, inter_gbs;       /* GB/s (1e9 bytes) per GPU and direction */
    double intra_lat_us, inter_lat_us; /* per message */
    double tflops, tflops_bwd;         /* achieved attention TFLOP/s per GPU (assumed); bwd 0:
                                          the forward's */
    int per_node;                      /* GPUs per node */
} lm_params_t;

/* NVLink 4 on H100 / H200 (900 GB/s both ways: 450 each), one 400 Gb/s InfiniBand NIC per GPU
   (50 GB/s), 400 TFLOP/s of bf16 attention (an assumption: FlashAttention 2 on an H100 reaches
   about that forward), 8 GPUs a node. */
#define LM_DEFAULTS {450.0, 50.0, 3.0, 5.0, 400.0, 0.0, 8}

typedef struct {
    double compute_ms[2];   /* [forward, backward] */
    double a2a_ms[2];       /* the all-to-alls (0 for a flat ring) */
    double ring_comm_ms[2]; /* the ring's exchanges alone */
    double ring_ms[2];      /* the ring, exchanges hidden behind compute where they can be */
    double exposed_ms[2];   /* ring_ms - compute_ms: exchange time not hidden */
    double call_ms[2];      /* a2a_ms + ring_ms */
    double step_ms;         /* forward + backward */
    int a2a_remote;         /* members of the rank's group on other nodes */
    int ring_remote;        /* the rank's ring leaves its node (its exchanges use the NIC) */
} lm_estimate_t;

/* One model flag (--intra-gbs, --inter-gbs, --intra-lat-us, --inter-lat-us, --tflops,
   --tflops-bwd, --per-node): 1 taken, 0 not a model flag, -1 a bad value (message printed to
   stderr under `prog`). */
int lm_parse_flag(const char *prog, const char *flag, const char *value, lm_params_t *m);
extern const char lm_usage[]; /* the flags' usage lines */
/* The parameters in one line, "# model: ..." (prefix "# ") */
void lm_print_params(FILE *f, const char *prefix, const lm_params_t *m);

/* Allowed query-key pairs of n query tokens (global indices into desc's packed batch) under
   desc's mask (SPEC 3: causal, window; key lengths from cu_seqlens_k, bottom-right). */
double lm_pairs(const ringattn_plan_desc_t *desc, const int32_t *tokens, int64_t n);
/* Forward FLOPs of rank `rank` of P (desc.ulysses_size, ulysses_strided): its heads over the
   queries it attends, counted on the flat plan the layout makes for its group (a simulated comm
   of P_r ranks). < 0: that plan was refused (ringattn_last_error says why). */
double lm_rank_flops(const ringattn_plan_desc_t *desc, int P, int rank);
/* The estimate for the plan of `info` (rank, ranks, ulysses_size, bytes, steps). */
void lm_estimate(const lm_params_t *m, const ringattn_plan_info_t *info, int strided,
                 double fwd_flops, lm_estimate_t *e);

#endif
