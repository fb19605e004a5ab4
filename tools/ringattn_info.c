/*
 * ringattn-info: what a user pastes into a bug report, and what a plan will move before it runs.
 * Installed with the library.
 *
 *   ringattn-info                      the version, the build (backends, transports), the CPU
 *                                      (model, instruction sets), the BLAS and the kernels the
 *                                      CPU backend runs, the visible GPUs
 *   ringattn-info --seq 8192 --heads 8 --kv-heads 2 --dim 128 --causal --ranks 4 ...
 *                                      and the plans of that descriptor on P ranks (threads of
 *                                      this process): each rank's schedule, bytes per call and
 *                                      per ring step, tiles and memory
 *   ... --ranks 64 --ulysses 8         2D plans (P_u x P_r): also the all-to-all's bytes inside
 *                                      the group (intra-node) beside the ring's between groups
 *   ... --ranks 1024 --simulate --rank 5
 *                                      the plan of one rank of a simulated world
 *                                      (ringattn_comm_create_simulated): any P, no peers, no
 *                                      data; automatic above 64 ranks
 *   ... --model [--csv]                the link model's estimate (tools/link_model.h) per rank,
 *                                      and a table of every P_u that P, H and H_kv allow: bytes
 *                                      per link class, the all-to-all's, the ring's and the
 *                                      compute's estimated time, the step (forward + backward);
 *                                      --csv prints that table alone, comma separated
 *
 * Only the public API (ringattn.h): the plans are made over ringattn_comm_create_threads (the
 * device-copy threads transport for --backend cuda) or a simulated comm, which schedule and
 * size them as any transport would; nothing is computed. The schedule line is the plan's own
 * RINGATTN_LOG=info line, taken with ringattn_set_log_callback. GPUs are listed through the
 * CUDA driver (libcuda.so.1, loaded if present). Exit 0, or 2 on bad flags (a message says
 * which) or a refused descriptor (its message printed).
 */
#include <ringattn.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "info.h"
#include "link_model.h"

#define MAX_SEQS 64
#define MAX_THREADS 64 /* ranks made as threads of this process; beyond: a simulated world */
#define MAX_LISTED 256 /* ranks listed (--rank all) in a simulated world */

typedef struct {
    ringattn_plan_desc_t d;
    int32_t cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1], cu_new[MAX_SEQS + 1];
    int ranks, plans;  /* plans: a descriptor was given */
    int simulate;      /* the plans of a simulated world, one rank at a time */
    int rank;          /* the rank listed, -1 all (default: all over threads, 0 simulated) */
    int table_rank;    /* the model table's: --rank as given, else 0 (each row makes P plans
                          for all: slow for large T) */
    int model, csv;    /* --model, --csv */
    lm_params_t lm;
} options_t;

typedef struct {
    ringattn_comm_t comm;
    int rank;
    ringattn_status_t st;
    char error[512];
    char schedule[512]; /* the plan's schedule line (the inner ring's, in a 2D plan) */
    char grid[256];     /* a 2D plan's shape line */
    ringattn_plan_info_t info;
} rank_t;

static const options_t *opts_;
static rank_t ranks_[MAX_LISTED];
/* The rank whose plan this thread makes: a 2D plan's inner ring logs its ring rank, not the
   grid's, so lines are kept by thread (the callback runs on the thread that logs). */
static _Thread_local rank_t *making_;

/* The plan's schedule and 2D lines (RINGATTN_LOG=info), kept per rank. */
static void keep_schedule(void *user, ringattn_log_level_t level, const char *subsystem,
                          int rank, int ranks, const char *message)
{
    (void)user, (void)level, (void)rank, (void)ranks;
    rank_t *r = making_;
    if (!r || strcmp(subsystem, "plan")) return;
    if (!strncmp(message, "schedule: ", 10) || !strncmp(message, "KV cache: ", 10))
        snprintf(r->schedule, sizeof r->schedule, "%s", message);
    else if (!strncmp(message, "2D plan: ", 9))
        snprintf(r->grid, sizeof r->grid, "%s", message + 9);
}

static void *make_plan(void *arg)
{
    rank_t *r = arg;
    ringattn_plan_t plan = NULL;
    making_ = r;
    r->st = ringattn_plan_create(r->comm, &opts_->d, &plan);
    making_ = NULL;
    if (r->st != RINGATTN_SUCCESS) {
        snprintf(r->error, sizeof r->error, "%s", ringattn_last_error());
        return NULL;
    }
    r->info = (ringattn_plan_info_t)RINGATTN_PLAN_INFO_INIT;
    ringattn_plan_get_info(plan, &r->info);
    ringattn_plan_destroy(plan);
    return NULL;
}

/* "a,b,c" into cu (prefix sums of the lengths); returns the count, -1 when bad. */
static int parse_lengths(const char *v, int32_t *cu)
{
    int n = 0;
    cu[0] = 0;
    for (const char *p = v; *p && n < MAX_SEQS; ++n) {
        char *end;
        const long len = strtol(p, &end, 10);
        if (end == p || len < 0 || (int64_t)cu[n] + len > INT32_MAX) return -1;
        cu[n + 1] = cu[n] + (int32_t)len;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static int usage(int code)
{
    printf("usage: ringattn-info [--seq L[,L...]] [--heads H] [--kv-heads HKV] [--dim D] [--dim-v DV]\n"
           "                     [--dtype f32|f16|bf16] [--causal] [--window LEFT[,RIGHT]]\n"
           "                     [--layout contiguous|zigzag|striped] [--ranks P] [--block Q,K]\n"
           "                     [--threads N] [--bias-heads N] [--keep-k K] [--softcap C]\n"
           "                     [--cache L[,L...]] [--sharded-cache] [--new L[,L...]]\n"
           "                     [--backend cpu|cuda] [--ulysses P_U] [--strided]\n"
           "                     [--simulate] [--rank R|all] [--model] [--csv]\n"
           "%s"
           "Without --seq: the version, the build, the CPU kernels and the GPUs. With it, also the\n"
           "plans of that descriptor on P ranks (--ranks, default 1: no comm), threads of this\n"
           "process; --simulate (automatic above %d ranks): the plan of rank --rank (default 0;\n"
           "all: up to %d ranks) of a simulated world, any P. --ulysses: 2D plans of P_U x P/P_U\n"
           "(--strided: strided groups). --model: the link model's estimate per rank and for every\n"
           "P_U that P, H and HKV allow (CPU plans; tools/link_model.h); --csv: that table alone.\n"
           "--cache: key lengths of a KV cache (cu_seqlens_k); --new: the new tokens' K/V\n"
           "(cu_seqlens_new).\n",
           lm_usage, MAX_THREADS, MAX_LISTED);
    return code;
}

static int bad(const char *flag, const char *value, const char *expected)
{
    fprintf(stderr, "ringattn-info: %s%s%s: expected %s (see --help)\n", flag, value ? " " : "",
            value ? value : "", expected);
    return 0;
}

/* A whole number in [lo, hi] into *out, or 0. */
static int whole(const char *v, long lo, long hi, int *out)
{
    char *end = NULL;
    const long n = strtol(v, &end, 10);
    if (end == v || *end || n < lo || n > hi) return 0;
    *out = (int)n;
    return 1;
}

/* The flags with a value; 0 (said) when bad. */
static int parse_value(options_t *o, const char *a, const char *v)
{
    static const char *const layouts[] = {"contiguous", "zigzag", "striped"};
    static const char *const dtypes[] = {"f32", "f16", "bf16"};
    ringattn_plan_desc_t *d = &o->d;
    const struct { const char *flag; int *to; long lo, hi; } ints[] = {
        {"--heads", &d->num_heads, 1, INT32_MAX}, {"--kv-heads", &d->num_kv_heads, 0, INT32_MAX},
        {"--dim", &d->head_dim, 1, INT32_MAX}, {"--dim-v", &d->head_dim_v, 0, INT32_MAX},
        {"--ranks", &o->ranks, 1, 1 << 20}, {"--threads", &d->num_threads, 0, INT32_MAX},
        {"--bias-heads", &d->key_bias_heads, 0, INT32_MAX}, {"--keep-k", &d->keep_k, 0, INT32_MAX},
        {"--ulysses", &d->ulysses_size, 0, 1 << 20}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; ++i)
        if (!strcmp(a, ints[i].flag))
            return whole(v, ints[i].lo, ints[i].hi, ints[i].to) ? 1 : bad(a, v, "a whole number in range");
    int n = 0;
    if (!strcmp(a, "--seq")) {
        if ((n = parse_lengths(v, o->cu_q)) < 1) return bad(a, v, "token counts L[,L...]");
        d->num_seqs = n, d->cu_seqlens = o->cu_q, o->plans = 1;
    } else if (!strcmp(a, "--cache")) {
        if (parse_lengths(v, o->cu_k) < 1) return bad(a, v, "key counts L[,L...]");
        d->cu_seqlens_k = o->cu_k;
    } else if (!strcmp(a, "--new")) {
        if (parse_lengths(v, o->cu_new) < 1) return bad(a, v, "new token counts L[,L...]");
        d->cu_seqlens_new = o->cu_new;
    } else if (!strcmp(a, "--rank")) {
        if (!strcmp(v, "all")) o->rank = -1;
        else if (!whole(v, 0, (1 << 20) - 1, &o->rank)) return bad(a, v, "a rank or all");
    } else if (!strcmp(a, "--softcap")) {
        char *end = NULL;
        d->softcap = strtof(v, &end);
        if (end == v || *end) return bad(a, v, "a number");
    } else if (!strcmp(a, "--window")) {
        if (sscanf(v, "%d,%d", &d->window_left, &d->window_right) < 1) return bad(a, v, "LEFT[,RIGHT]");
    } else if (!strcmp(a, "--block")) {
        if (sscanf(v, "%d,%d", &d->block_q, &d->block_k) != 2) return bad(a, v, "Q,K");
    } else if (!strcmp(a, "--dtype")) {
        for (n = 0; n < 3 && strcmp(v, dtypes[n]); ++n) continue;
        if (n == 3) return bad(a, v, "f32, f16 or bf16");
        d->dtype = (ringattn_dtype_t)n;
    } else if (!strcmp(a, "--layout")) {
        for (n = 0; n < 3 && strcmp(v, layouts[n]); ++n) continue;
        if (n == 3) return bad(a, v, "contiguous, zigzag or striped");
        d->layout = (ringattn_layout_t)n;
    } else if (!strcmp(a, "--backend")) {
        if (strcmp(v, "cpu") && strcmp(v, "cuda")) return bad(a, v, "cpu or cuda");
        d->backend = !strcmp(v, "cuda") ? RINGATTN_BACKEND_CUDA : RINGATTN_BACKEND_CPU;
    } else {
        return bad(a, NULL, "a known flag");
    }
    return 1;
}

static int parse(int argc, char **argv, options_t *o)
{
    const ringattn_plan_desc_t init = RINGATTN_PLAN_DESC_INIT;
    const lm_params_t lm = LM_DEFAULTS;
    o->d = init, o->lm = lm;
    o->d.num_heads = 8, o->d.num_kv_heads = 0, o->d.head_dim = 128;
    o->ranks = 1, o->rank = -2; /* -2: not given */
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) exit(usage(0));
        int *const set[] = {&o->d.causal, &o->d.sharded_cache, &o->d.ulysses_strided,
                            &o->simulate, &o->model, &o->csv};
        const char *const names[] = {"--causal", "--sharded-cache", "--strided", "--simulate",
                                     "--model", "--csv"};
        int k = 0;
        while (k < 6 && strcmp(a, names[k])) ++k;
        if (k < 6) { *set[k] = 1; continue; }
        const int taken = lm_parse_flag("ringattn-info", a, v, &o->lm);
        if (taken < 0) return 0;
        if (!taken && !v) return bad(a, NULL, "a known flag, with its value");
        ++i;
        if (!taken && !parse_value(o, a, v)) return 0;
    }
    const ringattn_plan_desc_t *d = &o->d;
    o->model |= o->csv;
    if (!o->plans && (o->model || o->simulate || d->ulysses_size || o->rank != -2))
        return bad("--model, --csv, --simulate, --ulysses and --rank", NULL, "--seq as well");
    if (d->backend == RINGATTN_BACKEND_CUDA && (o->model || o->simulate))
        return bad("--backend cuda", NULL, "--backend cpu with --model and --simulate (a "
                   "simulated comm moves host memory; the model reads CPU plans)");
    if (o->model && (d->cu_seqlens_k || d->cu_seqlens_new || d->sharded_cache))
        return bad("--model", NULL, "a plan without a KV cache (--cache, --new, --sharded-cache)");
    if (o->rank >= o->ranks) return bad("--rank", NULL, "a rank below --ranks");
    o->simulate |= o->ranks > MAX_THREADS;
    o->table_rank = o->rank == -2 ? 0 : o->rank;
    if (o->rank == -2) o->rank = o->simulate ? 0 : -1;
    if (o->simulate && o->rank == -1 && o->ranks > MAX_LISTED)
        return bad("--rank all", NULL, "one rank (--rank R) of a simulated world above 256 ranks");
    return 1;
}

/* The ring's (a 2D plan: between groups) and the all-to-all's bytes of one rank. */
static void print_bytes(const ringattn_plan_info_t *i)
{
    const int moves = i->num_steps > 1 ? i->num_steps - 1 : 1;
    printf("    %sbytes per call: forward %zu sent / %zu received, backward %zu / %zu; per "
           "exchange (%d): forward %zu / %zu\n",
           i->ulysses_size > 1 ? "ring (inter-group) " : "", i->forward_bytes_sent,
           i->forward_bytes_received, i->backward_bytes_sent, i->backward_bytes_received, moves,
           i->forward_bytes_sent / (size_t)moves, i->forward_bytes_received / (size_t)moves);
    if (i->ulysses_size > 1)
        printf("    all-to-all (intra-group) bytes per call: forward %zu sent / %zu received, "
               "backward %zu / %zu\n",
               i->alltoall_forward_bytes_sent, i->alltoall_forward_bytes_received,
               i->alltoall_backward_bytes_sent, i->alltoall_backward_bytes_received);
}

/* The listed ranks' plans, over threads or a simulated world; 2 when one was refused. */
static int print_plans(const options_t *o)
{
    ringattn_comm_t comms[MAX_THREADS] = {0};
    const int P = o->ranks, first = o->rank >= 0 ? o->rank : 0, count = o->rank >= 0 ? 1 : P;
    opts_ = o;
    if (!o->simulate && P > 1) {
        const ringattn_status_t st = o->d.backend == RINGATTN_BACKEND_CUDA
                                         ? ringattn_comm_create_threads_device(P, -1, comms)
                                         : ringattn_comm_create_threads(P, comms);
        if (st != RINGATTN_SUCCESS) {
            printf("plans: no comm of %d ranks: %s\n", P, ringattn_last_error());
            return 2;
        }
    }
    ringattn_set_log_callback(keep_schedule, NULL, RINGATTN_LOG_INFO);
    if (!o->simulate) { /* every rank, each on its thread: plan creation is collective */
        pthread_t th[MAX_THREADS];
        for (int r = 0; r < P; ++r) {
            ranks_[r] = (rank_t){.comm = comms[r], .rank = r};
            pthread_create(&th[r], NULL, make_plan, &ranks_[r]);
        }
        for (int r = 0; r < P; ++r) pthread_join(th[r], NULL);
        for (int r = 0; r < P; ++r) ringattn_comm_destroy(comms[r]);
    } else { /* a simulated rank's plan is made alone */
        for (int i = 0; i < count; ++i) {
            rank_t *x = &ranks_[i];
            *x = (rank_t){.rank = first + i};
            if ((x->st = ringattn_comm_create_simulated(x->rank, P, &x->comm)) != RINGATTN_SUCCESS)
                snprintf(x->error, sizeof x->error, "%s", ringattn_last_error());
            else make_plan(x);
            ringattn_comm_destroy(x->comm);
        }
    }
    ringattn_set_log_callback(NULL, NULL, RINGATTN_LOG_OFF);
    if (o->simulate)
        printf("plans: %s%d of %d ranks (a simulated world: no peers, nothing computed)\n",
               count > 1 ? "ranks 0-" : "rank ", count > 1 ? P - 1 : first, P);
    else
        printf("plans: %d rank(s)%s\n", P, P > 1 ? " (threads of this process)" : ", no comm");
    int status = 0;
    for (int i = 0; i < count; ++i) {
        const rank_t *x = &ranks_[o->simulate ? i : first + i]; /* simulated: the listed alone */
        if (x->st != RINGATTN_SUCCESS) {
            printf("  rank %d: refused (%s): %s\n", x->rank, ringattn_status_string(x->st), x->error);
            status = 2;
            continue;
        }
        const ringattn_plan_info_t *i_ = &x->info;
        printf("  rank %d: %lld local tokens; %d ring steps, %d computing; %s\n", x->rank,
               (long long)i_->local_tokens, i_->num_steps, i_->compute_steps,
               x->schedule[0] ? x->schedule : "(one rank: no schedule)");
        if (x->grid[0]) printf("    2D: %s\n", x->grid);
        print_bytes(i_);
        printf("    tiles %d x %d; memory %zu bytes: workspace %zu, buffers %zu, host %zu; key "
               "bias received %zu\n",
               i_->block_q, i_->block_k, i_->memory_bytes, i_->workspace_bytes, i_->buffer_bytes,
               i_->host_bytes, i_->bias_bytes_received);
        if (o->model) info_model_rank(&o->lm, &o->d, i_);
    }
    return status;
}

int main(int argc, char **argv)
{
    options_t o;
    memset(&o, 0, sizeof o);
    if (!parse(argc, argv, &o)) return 2;
    if (o.csv) return info_model_table(&o.lm, &o.d, o.ranks, o.table_rank, 1);
    printf("ringattn %s\n", ringattn_version_string());
    printf("build: %s\n", ringattn_build_info());
    info_print_cpu();
    printf("CPU kernels: %s\n", ringattn_cpu_kernels());
    info_print_gpus();
    if (!o.plans) return 0;
    int status = print_plans(&o);
    if (o.model && info_model_table(&o.lm, &o.d, o.ranks, o.table_rank, 0)) status = 2;
    return status;
}
