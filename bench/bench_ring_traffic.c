/*
 * bench_ring_traffic.c: part of bench_ring (bench_ring.h). Every rank's token map
 * (ringattn_plan_local_tokens) and, with the SPEC 3 mask, which shards each rank needs, how far
 * each shard must travel and the least bytes a call can move; the traffic table against the
 * bytes the library reports (ringattn_plan_get_info).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime (common.h) */
#include "bench_ring.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- token maps -> mask needs */

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int holds_key_in(const int32_t *keys, int64_t n, int64_t lo, int64_t hi) {
    int64_t a = 0, b = n; /* first key >= lo */
    while (a < b) {
        const int64_t m = (a + b) / 2;
        if (keys[m] < lo) a = m + 1; else b = m;
    }
    return a < n && keys[a] <= hi;
}

/* counts and tokens: [P] arrays, taken over by the map */
void map_build(ring_map_t *m, const shape_t *s, int P, int64_t *count, int32_t **tokens) {
    m->P = P, m->count = count, m->tokens = tokens;
    m->meet = calloc((size_t)P * P, 1);
    m->last_hop = calloc((size_t)P, sizeof(int));
    m->needers = calloc((size_t)P, sizeof(int));
    int32_t **sorted = xmalloc(sizeof(int32_t *) * (size_t)P);
    for (int r = 0; r < P; ++r) {
        sorted[r] = xmalloc(sizeof(int32_t) * (size_t)(count[r] + 1));
        memcpy(sorted[r], tokens[r], sizeof(int32_t) * (size_t)count[r]);
        qsort(sorted[r], (size_t)count[r], sizeof(int32_t), cmp_i32);
    }
    for (int r = 0; r < P; ++r)
        for (int64_t i = 0; i < count[r]; ++i) {
            int64_t lo, hi;
            key_range(s, tokens[r][i], &lo, &hi);
            for (int t = 0; t < P; ++t)
                if (!m->meet[r * P + t] && holds_key_in(sorted[t], count[t], lo, hi)) m->meet[r * P + t] = 1;
        }
    m->N = 1;
    for (int sh = 0; sh < P; ++sh) {
        for (int j = 1; j < P; ++j) /* rank sh + j holds shard sh at step j */
            if (m->meet[((sh + j) % P) * P + sh]) m->last_hop[sh] = j, ++m->needers[sh];
        if (m->last_hop[sh] + 1 > m->N) m->N = m->last_hop[sh] + 1;
    }
    for (int r = 0; r < P; ++r) free(sorted[r]);
    free(sorted);
}

void map_free(ring_map_t *m) {
    for (int r = 0; r < m->P; ++r) free(m->tokens[r]);
    free(m->tokens), free(m->count), free(m->meet), free(m->last_hop), free(m->needers);
}

double kv_bytes(const shape_t *s, const ring_map_t *m, int sh) { /* float32 K and V */
    return (double)m->count[sh] * s->HKV * 2.0 * s->D * sizeof(float);
}

/* Lower bounds per call: shard s reaches needers(s) other ranks (its K/V; in the backward also
   one float32 dK/dV message per needer, to the owner or on to the next needer). Per rank:
   the K/V it must receive. */
static void lower_bound(const shape_t *s, const ring_map_t *m, double *fwd_total,
                        double *bwd_total, double *need) {
    *fwd_total = *bwd_total = 0.0;
    for (int sh = 0; sh < m->P; ++sh) {
        *fwd_total += kv_bytes(s, m, sh) * m->needers[sh];
        *bwd_total += 2.0 * kv_bytes(s, m, sh) * m->needers[sh]; /* float32: dK/dV as big as K/V */
    }
    for (int r = 0; r < m->P; ++r) {
        need[r] = 0.0;
        for (int sh = 0; sh < m->P; ++sh)
            if (sh != r && m->meet[r * m->P + sh]) need[r] += kv_bytes(s, m, sh);
    }
}

/* Gathers every rank's token map to build the map (all ranks), and the infos (rank 0). */
void gather_maps(const shape_t *s, const outputs_t *x, ringattn_plan_t plan, ring_t *r) {
    const int P = ranks_;
    int64_t *count = xmalloc(sizeof(int64_t) * (size_t)P);
    MPI_Allgather(&x->rows, 1, MPI_INT64_T, count, 1, MPI_INT64_T, MPI_COMM_WORLD);
    int *cnt = xmalloc(sizeof(int) * (size_t)P), *dsp = xmalloc(sizeof(int) * (size_t)P);
    for (int i = 0, at = 0; i < P; at += cnt[i++]) cnt[i] = (int)count[i], dsp[i] = at;
    int32_t *all = xmalloc(sizeof(int32_t) * (size_t)s->T);
    MPI_Allgatherv(x->tokens, (int)x->rows, MPI_INT32_T, all, cnt, dsp, MPI_INT32_T, MPI_COMM_WORLD);
    int32_t **tokens = xmalloc(sizeof(int32_t *) * (size_t)P);
    for (int i = 0; i < P; ++i) {
        tokens[i] = xmalloc(sizeof(int32_t) * (size_t)(count[i] + 1));
        memcpy(tokens[i], all + dsp[i], sizeof(int32_t) * (size_t)count[i]);
    }
    map_build(&r->map, s, P, count, tokens);
    ringattn_plan_info_t mine = RINGATTN_PLAN_INFO_INIT;
    ringattn_plan_get_info(plan, &mine);
    r->info = xmalloc(sizeof mine * (size_t)P);
    MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, r->info, (int)sizeof mine, MPI_BYTE, 0, MPI_COMM_WORLD);
    free(cnt), free(dsp), free(all);
}

/* ---------------------------------------------------------------- the traffic table (rank 0) */

typedef struct {
    shape_t s;
    ring_t *ring;
    double ratio[2]; /* bytes sent by all ranks / lower bound, fwd and bwd */
} traffic_entry_t;

static traffic_entry_t traffic[16];
static int ntraffic;

void remember_traffic(const shape_t *s, ring_t *r) {
    if (rank_ == 0 && r->ok && ntraffic < 16) traffic[ntraffic++] = (traffic_entry_t){*s, r, {NAN, NAN}};
}

/* Per rank: steps, compute steps, bytes sent / received per call against the bytes it needs;
   per configuration: totals against the lower bound. Returns the worst forward ratio. */
void print_traffic(void) {
    printf("# traffic per call, MB (1e6 bytes): sent/recv = ringattn_plan_get_info; need = K/V of\n"
           "# the other shards this rank has an allowed pair with (what it must receive at least);\n"
           "# bound = sum over shards of their bytes x the OTHER ranks that need them (bwd: K/V +\n"
           "# float32 dK/dV). steps = ring steps of P; computes = steps at which the rank computes\n");
    printf("%6s %-8s %-7s %5s %5s %4s %8s %9s %9s %9s %9s %9s\n", "seq", "mask", "layout", "ranks",
           "steps", "rank", "computes", "fwd_sent", "fwd_recv", "fwd_need", "bwd_sent", "bwd_recv");
    for (int k = 0; k < ntraffic; ++k) {
        const shape_t *s = &traffic[k].s;
        const ring_t *r = traffic[k].ring;
        const ring_map_t *m = &r->map;
        char mask[32];
        mask_name(s, mask, sizeof mask);
        double bf, bb, *need = xmalloc(sizeof(double) * (size_t)m->P), sf = 0, sb = 0;
        lower_bound(s, m, &bf, &bb, need);
        for (int i = 0; i < m->P; ++i) {
            const ringattn_plan_info_t *in = &r->info[i];
            printf("%6d %-8s %-7s %5d %2d/%-2d %4d %8d %9.2f %9.2f %9.2f %9.2f %9.2f\n", s->T, mask,
                   layout_names[r->layout], r->P, in->num_steps, r->P, i, in->compute_steps,
                   in->forward_bytes_sent * 1e-6, in->forward_bytes_received * 1e-6, need[i] * 1e-6,
                   in->backward_bytes_sent * 1e-6, in->backward_bytes_received * 1e-6);
            sf += (double)in->forward_bytes_sent, sb += (double)in->backward_bytes_sent;
            if (in->num_steps != m->N)
                printf("#   warning: rank %d: the library's plan has %d steps, the mask needs %d\n", i,
                       in->num_steps, m->N);
            if (json)
                fprintf(json,
                        "{\"type\":\"traffic\",\"seq\":%d,\"mask\":\"%s\",\"layout\":\"%s\",\"ranks\":%d,"
                        "\"transport\":\"%s\",\"rank\":%d,\"steps\":%d,\"compute_steps\":%d,"
                        "\"fwd_sent\":%zu,\"fwd_recv\":%zu,\"fwd_need\":%.0f,\"bwd_sent\":%zu,"
                        "\"bwd_recv\":%zu}\n",
                        s->T, mask, layout_names[r->layout], r->P,
                        r->threads_transport ? "threads" : "mpi", i, in->num_steps,
                        in->compute_steps, in->forward_bytes_sent, in->forward_bytes_received,
                        need[i], in->backward_bytes_sent, in->backward_bytes_received);
        }
        printf("#   total: fwd %.2f MB sent, lower bound %.2f MB (x%.2f); bwd %.2f MB, bound %.2f MB "
               "(x%.2f)%s\n", sf * 1e-6, bf * 1e-6, bf > 0 ? sf / bf : 1.0, sb * 1e-6, bb * 1e-6,
               bb > 0 ? sb / bb : 1.0, r->threads_transport ? " [threads transport]" : "");
        if (json)
            fprintf(json,
                    "{\"type\":\"traffic_total\",\"seq\":%d,\"mask\":\"%s\",\"layout\":\"%s\","
                    "\"ranks\":%d,\"steps\":%d,\"fwd_sent\":%.0f,\"fwd_bound\":%.0f,"
                    "\"bwd_sent\":%.0f,\"bwd_bound\":%.0f}\n",
                    s->T, mask, layout_names[r->layout], r->P, m->N, sf, bf, sb, bb);
        traffic[k].ratio[0] = bf > 0 ? sf / bf : 1.0, traffic[k].ratio[1] = bb > 0 ? sb / bb : 1.0;
        free(need);
    }
}

void print_traffic_figures(void) {
    printf("#   bytes sent / lower bound (1 = only what the mask needs), forward / backward:\n");
    for (int k = 0; k < ntraffic; ++k) {
        char mask[32];
        mask_name(&traffic[k].s, mask, sizeof mask);
        printf("#     %-8s %-7s P = %d: %.2f / %.2f\n", mask, layout_names[traffic[k].ring->layout],
               traffic[k].ring->P, traffic[k].ratio[0], traffic[k].ratio[1]);
    }
}
