/*
 * ringattn-info: what a user pastes into a bug report. Installed with the library.
 *
 *   ringattn-info                      the version, the build (backends, transports), the CPU
 *                                      (model, instruction sets), the BLAS and the kernels the
 *                                      CPU backend runs, the visible GPUs
 *   ringattn-info --seq 8192 --heads 8 --kv-heads 2 --dim 128 --causal --ranks 4 ...
 *                                      and the plans of that descriptor on P ranks (threads of
 *                                      this process): each rank's schedule, bytes per call and
 *                                      per ring step, tiles and memory
 *
 * Only the public API (ringattn.h): the plans are made over ringattn_comm_create_threads (the
 * device-copy threads transport for --backend cuda), which schedules and sizes them as any
 * transport would; nothing is computed. The schedule line is the plan's own RINGATTN_LOG=info
 * line, taken with ringattn_set_log_callback. GPUs are listed through the CUDA driver
 * (libcuda.so.1, loaded if present). Exit 0, or 2 on bad flags or a refused descriptor (its
 * message printed).
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <ringattn.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEQS 64
#define MAX_RANKS 64

typedef struct {
    ringattn_plan_desc_t d;
    int32_t cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1], cu_new[MAX_SEQS + 1];
    int ranks, plans; /* plans: a descriptor was given */
} options_t;

typedef struct {
    const options_t *o;
    ringattn_comm_t comm;
    int rank;
    ringattn_status_t st;
    char error[512];
    char schedule[512];
    ringattn_plan_info_t info;
} rank_t;

static rank_t ranks_[MAX_RANKS];

/* The plan's schedule line (RINGATTN_LOG=info), kept per rank. */
static void keep_schedule(void *user, ringattn_log_level_t level, const char *subsystem,
                          int rank, int ranks, const char *message)
{
    (void)user, (void)level, (void)ranks;
    if (strcmp(subsystem, "plan") || rank < 0 || rank >= MAX_RANKS) return;
    if (!strncmp(message, "schedule: ", 10) || !strncmp(message, "KV cache: ", 10))
        snprintf(ranks_[rank].schedule, sizeof ranks_[rank].schedule, "%s", message);
}

static void *make_plan(void *arg)
{
    rank_t *r = arg;
    ringattn_plan_t plan = NULL;
    r->st = ringattn_plan_create(r->comm, &r->o->d, &plan);
    if (r->st != RINGATTN_SUCCESS) {
        snprintf(r->error, sizeof r->error, "%s", ringattn_last_error());
        return NULL;
    }
    r->info = (ringattn_plan_info_t)RINGATTN_PLAN_INFO_INIT;
    ringattn_plan_get_info(plan, &r->info);
    ringattn_plan_destroy(plan);
    return NULL;
}

/* The CPU's model and the instruction sets the CPU kernels look for, and the BLAS the library
   was loaded with (OpenBLAS names its kernels; found by name in this process). */
static void print_cpu(void)
{
    char model[256] = "?";
    FILE *f = fopen("/proc/cpuinfo", "r");
    for (char line[512]; f && fgets(line, sizeof line, f);)
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
            model[strcspn(model, "\n")] = '\0';
            break;
        }
    if (f) fclose(f);
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    printf("CPU: %s; avx2 %s, avx512f %s, avx512bf16 %s, avx512fp16 %s\n", model,
           __builtin_cpu_supports("avx2") ? "yes" : "no",
           __builtin_cpu_supports("avx512f") ? "yes" : "no",
           __builtin_cpu_supports("avx512bf16") ? "yes" : "no",
           __builtin_cpu_supports("avx512fp16") ? "yes" : "no");
#else
    printf("CPU: %s\n", model);
#endif
    char *(*config)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_config");
    char *(*core)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_corename");
    if (config && core) {
        const char *forced = getenv("OPENBLAS_CORETYPE");
        printf("BLAS: %s, kernels %s%s%s%s\n", config(), core(),
               forced ? " (OPENBLAS_CORETYPE=" : "", forced ? forced : "", forced ? ")" : "");
    } else {
        printf("BLAS: not OpenBLAS (no openblas_get_config in this process)\n");
    }
}

/* The visible GPUs through the CUDA driver API, if it is installed. */
static void print_gpus(void)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        printf("GPUs: none visible (no CUDA driver: libcuda.so.1 not found)\n");
        return;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(cuda, "cuDeviceGetCount");
    int (*get)(int *, int) = (int (*)(int *, int))dlsym(cuda, "cuDeviceGet");
    int (*name)(char *, int, int) = (int (*)(char *, int, int))dlsym(cuda, "cuDeviceGetName");
    int (*mem)(size_t *, int) = (int (*)(size_t *, int))dlsym(cuda, "cuDeviceTotalMem_v2");
    int (*version)(int *) = (int (*)(int *))dlsym(cuda, "cuDriverGetVersion");
    int n = 0, v = 0;
    if (!init || !count || !get || !name || init(0) != 0 || count(&n) != 0) {
        printf("GPUs: none visible (the CUDA driver did not initialise)\n");
        dlclose(cuda);
        return;
    }
    if (version) version(&v);
    printf("GPUs: %d visible (CUDA driver %d.%d)\n", n, v / 1000, v % 1000 / 10);
    for (int i = 0; i < n; ++i) {
        int dev = 0;
        char buf[256] = "?";
        size_t bytes = 0;
        get(&dev, i);
        name(buf, sizeof buf, dev);
        if (mem) mem(&bytes, dev);
        printf("  %d: %s, %.1f GiB\n", i, buf, (double)bytes / (1u << 30));
    }
    dlclose(cuda);
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
           "                     [--backend cpu|cuda]\n"
           "Without --seq: the version, the build, the CPU kernels and the GPUs. With it, also the\n"
           "plans of that descriptor on P ranks (--ranks, default 1: no comm). --cache: key\n"
           "lengths of a KV cache (cu_seqlens_k); --new: the new tokens' K/V (cu_seqlens_new).\n");
    return code;
}

static int parse(int argc, char **argv, options_t *o)
{
    const ringattn_plan_desc_t init = RINGATTN_PLAN_DESC_INIT;
    o->d = init;
    o->d.num_heads = 8, o->d.num_kv_heads = 0, o->d.head_dim = 128;
    o->ranks = 1;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) exit(usage(0));
        if (!strcmp(a, "--causal")) { o->d.causal = 1; continue; }
        if (!strcmp(a, "--sharded-cache")) { o->d.sharded_cache = 1; continue; }
        if (!v) return 0;
        ++i;
        int n = 0;
        if (!strcmp(a, "--seq")) {
            if ((n = parse_lengths(v, o->cu_q)) < 0) return 0;
            o->d.num_seqs = n, o->d.cu_seqlens = o->cu_q, o->plans = 1;
        } else if (!strcmp(a, "--cache")) {
            if (parse_lengths(v, o->cu_k) < 0) return 0;
            o->d.cu_seqlens_k = o->cu_k;
        } else if (!strcmp(a, "--new")) {
            if (parse_lengths(v, o->cu_new) < 0) return 0;
            o->d.cu_seqlens_new = o->cu_new;
        } else if (!strcmp(a, "--heads")) o->d.num_heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) o->d.num_kv_heads = atoi(v);
        else if (!strcmp(a, "--dim")) o->d.head_dim = atoi(v);
        else if (!strcmp(a, "--dim-v")) o->d.head_dim_v = atoi(v);
        else if (!strcmp(a, "--ranks")) o->ranks = atoi(v);
        else if (!strcmp(a, "--threads")) o->d.num_threads = atoi(v);
        else if (!strcmp(a, "--bias-heads")) o->d.key_bias_heads = atoi(v);
        else if (!strcmp(a, "--keep-k")) o->d.keep_k = atoi(v);
        else if (!strcmp(a, "--softcap")) o->d.softcap = (float)atof(v);
        else if (!strcmp(a, "--window")) {
            if (sscanf(v, "%d,%d", &o->d.window_left, &o->d.window_right) < 1) return 0;
        } else if (!strcmp(a, "--block")) {
            if (sscanf(v, "%d,%d", &o->d.block_q, &o->d.block_k) != 2) return 0;
        } else if (!strcmp(a, "--dtype")) {
            o->d.dtype = !strcmp(v, "f16") ? RINGATTN_FLOAT16 : !strcmp(v, "bf16") ? RINGATTN_BFLOAT16
                                                                                 : RINGATTN_FLOAT32;
            if (strcmp(v, "f16") && strcmp(v, "bf16") && strcmp(v, "f32")) return 0;
        } else if (!strcmp(a, "--layout")) {
            o->d.layout = !strcmp(v, "zigzag") ? RINGATTN_LAYOUT_ZIGZAG
                          : !strcmp(v, "striped") ? RINGATTN_LAYOUT_STRIPED
                                                  : RINGATTN_LAYOUT_CONTIGUOUS;
        } else if (!strcmp(a, "--backend")) {
            o->d.backend = !strcmp(v, "cuda") ? RINGATTN_BACKEND_CUDA : RINGATTN_BACKEND_CPU;
        } else return 0;
    }
    return o->ranks >= 1 && o->ranks <= MAX_RANKS;
}

static void print_plans(const options_t *o)
{
    ringattn_comm_t comms[MAX_RANKS] = {0};
    const int P = o->ranks;
    if (P > 1) {
        const ringattn_status_t st = o->d.backend == RINGATTN_BACKEND_CUDA
                                         ? ringattn_comm_create_threads_device(P, -1, comms)
                                         : ringattn_comm_create_threads(P, comms);
        if (st != RINGATTN_SUCCESS) {
            printf("plans: no comm of %d ranks: %s\n", P, ringattn_last_error());
            return;
        }
    }
    ringattn_set_log_callback(keep_schedule, NULL, RINGATTN_LOG_INFO);
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < P; ++r) {
        ranks_[r] = (rank_t){.o = o, .comm = comms[r], .rank = r};
        pthread_create(&th[r], NULL, make_plan, &ranks_[r]);
    }
    for (int r = 0; r < P; ++r) pthread_join(th[r], NULL);
    ringattn_set_log_callback(NULL, NULL, RINGATTN_LOG_OFF);
    for (int r = 0; r < P; ++r) ringattn_comm_destroy(comms[r]);
    printf("plans: %d rank(s)%s\n", P, P > 1 ? " (threads of this process)" : ", no comm");
    for (int r = 0; r < P; ++r) {
        const rank_t *x = &ranks_[r];
        if (x->st != RINGATTN_SUCCESS) {
            printf("  rank %d: refused (%s): %s\n", r, ringattn_status_string(x->st), x->error);
            continue;
        }
        const ringattn_plan_info_t *i = &x->info;
        const int moves = i->num_steps > 1 ? i->num_steps - 1 : 1;
        printf("  rank %d: %lld local tokens; %d ring steps, %d computing; %s\n", r,
               (long long)i->local_tokens, i->num_steps, i->compute_steps,
               x->schedule[0] ? x->schedule : "(one rank: no schedule)");
        printf("    bytes per call: forward %zu sent / %zu received, backward %zu / %zu; per "
               "exchange (%d): forward %zu / %zu\n",
               i->forward_bytes_sent, i->forward_bytes_received, i->backward_bytes_sent,
               i->backward_bytes_received, moves, i->forward_bytes_sent / (size_t)moves,
               i->forward_bytes_received / (size_t)moves);
        printf("    tiles %d x %d; memory %zu bytes: workspace %zu, buffers %zu, host %zu; key "
               "bias received %zu\n",
               i->block_q, i->block_k, i->memory_bytes, i->workspace_bytes, i->buffer_bytes,
               i->host_bytes, i->bias_bytes_received);
    }
}

int main(int argc, char **argv)
{
    options_t o;
    memset(&o, 0, sizeof o);
    if (!parse(argc, argv, &o)) {
        fprintf(stderr, "ringattn-info: bad flags\n");
        return usage(2);
    }
    printf("ringattn %s\n", ringattn_version_string());
    printf("build: %s\n", ringattn_build_info());
    print_cpu();
    printf("CPU kernels: %s\n", ringattn_cpu_kernels());
    print_gpus();
    if (!o.plans) return 0;
    print_plans(&o);
    for (int r = 0; r < o.ranks; ++r)
        if (ranks_[r].st != RINGATTN_SUCCESS) return 2;
    return 0;
}
