/* bench_ring's flags and their defaults (bench_ring.h; bench/README.md has what they run). */
#define _POSIX_C_SOURCE 200809L /* strtok_r, sysconf */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_ring.h"

static void usage(void) {
    printf("usage: mpirun -n P bench_ring [--seq T] [--heads H] [--kv-heads HKV] [--dim D]\n"
           "                  [--layout LIST] [--threads N] [--reps N] [--sample ROWS]\n"
           "                  [--window-seq T] [--window W] [--window-ranks P] [--no-window]\n"
           "                  [--heavy-seq T] [--heavy-heads H] [--heavy-window W] [--no-overlap]\n"
           "                  [--decode-cache LIST] [--decode-steps N] [--no-decode]\n"
           "                  [--quick] [--json FILE] [--no-json]\n"
           "defaults: --seq 16384 --heads 8 --kv-heads 2 --dim 128 (causal) --layout\n"
           "  contiguous,zigzag,striped --threads 0 (cores / ranks on the node, at least 1)\n"
           "  --reps 1 --sample 16; traffic case --window-seq 16384 --window 1024\n"
           "  --window-ranks 4 (over MPI if the job has that many ranks, else over threads in\n"
           "  rank 0); overlap case --heavy-seq 16384 --heavy-heads 8 (= kv heads) --heavy-window\n"
           "  256, zigzag; decode (heads 8/2, D 128)\n"
           "  --decode-cache 32768,131072,524288,1048576 --decode-steps 9.\n"
           "  --quick: T 2048, heads 2/1, D 64, window 128, heavy T 4096, decode caches 4096,16384 (heads 2/1, D 64)\n"
           "  (a smoke run).\n");
}

static int parse_decode(const char *v, options_t *o) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    o->ndecode = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const long long n = atoll(tok);
        if (n < 1 || n > INT32_MAX || o->ndecode == 8) return 0;
        o->decode_cache[o->ndecode++] = n;
    }
    return o->ndecode > 0;
}

static int parse_layouts(const char *v, options_t *o) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v);
    o->nlayouts = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int l = -1;
        for (int i = 0; i < NUM_LAYOUTS; ++i)
            if (!strcmp(tok, layout_names[i])) l = i;
        if (!strcmp(tok, "contiguous")) l = 0;
        if (l < 0 || o->nlayouts == NUM_LAYOUTS) return 0;
        o->layouts[o->nlayouts++] = l;
    }
    return o->nlayouts > 0;
}

int parse_options(int argc, char **argv, options_t *o) {
    memset(o, 0, sizeof *o);
    o->main = (shape_t){16384, 8, 2, 128, 0};
    o->nlayouts = 3, o->layouts[0] = 0, o->layouts[1] = 1, o->layouts[2] = 2;
    o->reps = 1, o->sample = 16, o->overlap = 1;
    o->win = (shape_t){16384, 8, 2, 128, 1024};
    o->win_ranks = 4;
    o->heavy = (shape_t){16384, 8, 8, 128, 256};
    const int64_t caches[] = {32768, 131072, 524288, 1048576};
    o->ndecode = 4, o->decode_steps = 9, o->decode = (shape_t){0, 8, 2, 128, 0};
    memcpy(o->decode_cache, caches, sizeof caches);
    const int say = rank_ == 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { if (say) usage(); return -1; }
        if (!strcmp(a, "--no-window")) { o->win_ranks = 0; continue; }
        if (!strcmp(a, "--no-overlap")) { o->overlap = 0; continue; }
        if (!strcmp(a, "--no-decode")) { o->ndecode = 0; continue; }
        if (!strcmp(a, "--no-json")) { o->no_json = 1; continue; }
        if (!strcmp(a, "--quick")) {
            o->main = (shape_t){2048, 2, 1, 64, 0};
            o->win = (shape_t){2048, 2, 1, 64, 128};
            o->heavy = (shape_t){4096, 2, 2, 64, 64};
            o->ndecode = 2, o->decode_cache[0] = 4096, o->decode_cache[1] = 16384, o->decode_steps = 3;
            o->decode = (shape_t){0, 2, 1, 64, 0};
            continue;
        }
        if (!v) { if (say) fprintf(stderr, "bench_ring: %s: missing value or unknown flag\n", a); return 0; }
        ++i;
        int ok = 1;
        if (!strcmp(a, "--seq")) o->main.T = atoi(v);
        else if (!strcmp(a, "--heads")) o->main.H = o->win.H = atoi(v);
        else if (!strcmp(a, "--kv-heads")) o->main.HKV = o->win.HKV = atoi(v);
        else if (!strcmp(a, "--dim")) o->main.D = o->win.D = o->heavy.D = atoi(v);
        else if (!strcmp(a, "--layout")) ok = parse_layouts(v, o);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--reps")) o->reps = atoi(v);
        else if (!strcmp(a, "--sample")) o->sample = atoi(v);
        else if (!strcmp(a, "--window-seq")) o->win.T = atoi(v);
        else if (!strcmp(a, "--window")) o->win.window = atoi(v);
        else if (!strcmp(a, "--window-ranks")) o->win_ranks = atoi(v);
        else if (!strcmp(a, "--heavy-seq")) o->heavy.T = atoi(v);
        else if (!strcmp(a, "--heavy-heads")) o->heavy.H = o->heavy.HKV = atoi(v);
        else if (!strcmp(a, "--heavy-window")) o->heavy.window = atoi(v);
        else if (!strcmp(a, "--json")) o->json_path = v;
        else if (!strcmp(a, "--decode-cache")) ok = parse_decode(v, o);
        else if (!strcmp(a, "--decode-steps")) ok = (o->decode_steps = atoi(v)) > 0;
        else ok = 0;
        if (!ok) { if (say) fprintf(stderr, "bench_ring: %s %s: unknown flag or bad value (see --help)\n", a, v); return 0; }
    }
    const shape_t *all[3] = {&o->main, &o->win, &o->heavy};
    for (int k = 0; k < 3; ++k) {
        const shape_t *s = all[k];
        if ((k == 1 && o->win_ranks == 0) || (k == 2 && (o->heavy.T == 0 || !o->overlap))) continue;
        if (s->T < 1 || s->T > (1 << 24) || s->H < 1 || s->HKV < 1 || s->H % s->HKV || s->D < 1 ||
            s->D > 256 || s->window < -1) {
            if (say) fprintf(stderr, "bench_ring: invalid shape (T <= 2^24, H a multiple of HKV, D <= 256)\n");
            return 0;
        }
    }
    if (o->reps < 1 || o->sample < 1 || o->threads < 0 || o->win_ranks < 0 || o->win.window < 1) {
        if (say) fprintf(stderr, "bench_ring: invalid options (see --help)\n");
        return 0;
    }
    return 1;
}

int threads_per_rank(void) {
    MPI_Comm node;
    int local = 1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > local ? (int)(cores / local) : 1;
}
