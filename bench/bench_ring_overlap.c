/*
 * bench_ring_overlap.c: part of bench_ring (bench_ring.h). The time the ring spends inside MPI
 * (PMPI wrappers), the timed ring pass over MPI, the ring's messages alone (the exchange without
 * the compute) and the overlap table: how much of the exchange the ring hides behind compute.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime (common.h) */
#include "bench_ring.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- PMPI: time inside MPI */

/* The library's data plane reaches MPI through these calls (comm/mpi_exchange.c: posts, tests
   of each piece, the heartbeat and failure-notice probes). While pmpi_on is set they add up
   the wall time spent inside them: the part of the exchange the ring did not hide. */
static int pmpi_on;
static double pmpi_s, pmpi_max_s; /* total, longest single call */
static long pmpi_calls;

static void pmpi_add(double dt) {
    pmpi_s += dt, ++pmpi_calls;
    if (dt > pmpi_max_s) pmpi_max_s = dt;
}

/* Around each wrapped call: its wall time counts while pmpi_on is set (NaN: not timed). */
static double pmpi_begin(void) { return pmpi_on ? PMPI_Wtime() : NAN; }

static int pmpi_end(double t0, int rc) {
    if (!isnan(t0)) pmpi_add(PMPI_Wtime() - t0);
    return rc;
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *req) {
    const double t0 = pmpi_begin();
    return pmpi_end(t0, PMPI_Isend(buf, count, type, dest, tag, comm, req));
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int src, int tag, MPI_Comm comm,
              MPI_Request *req) {
    const double t0 = pmpi_begin();
    return pmpi_end(t0, PMPI_Irecv(buf, count, type, src, tag, comm, req));
}

int MPI_Test(MPI_Request *req, int *flag, MPI_Status *status) {
    const double t0 = pmpi_begin();
    return pmpi_end(t0, PMPI_Test(req, flag, status));
}

int MPI_Iprobe(int src, int tag, MPI_Comm comm, int *flag, MPI_Status *status) {
    const double t0 = pmpi_begin();
    return pmpi_end(t0, PMPI_Iprobe(src, tag, comm, flag, status));
}

/* ---------------------------------------------------------------- the timed ring pass */

/* One pass on every rank after a barrier; best of reps per rank, then the slowest rank. */
int timed_pass(ringattn_plan_t plan, const ringattn_tensors_t *t, int bwd, int reps, ring_t *r) {
    double best = INFINITY, best_mpi = 0.0, best_max = 0.0;
    long best_calls = 0;
    int ok = 1;
    for (int rep = 0; rep < reps && ok; ++rep) {
        MPI_Barrier(MPI_COMM_WORLD);
        pmpi_s = pmpi_max_s = 0.0, pmpi_calls = 0, pmpi_on = 1;
        const double t0 = MPI_Wtime();
        const ringattn_status_t st = bwd ? ringattn_backward(plan, t, NULL) : ringattn_forward(plan, t, NULL);
        const double dt = MPI_Wtime() - t0;
        pmpi_on = 0;
        ok = all_ok(api_ok(bwd ? "ringattn_backward" : "ringattn_forward", st));
        if (dt < best) best = dt, best_mpi = pmpi_s, best_max = pmpi_max_s, best_calls = pmpi_calls;
    }
    struct { double v; int r; } mine = {best, rank_}, slowest;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
    MPI_Allreduce(&best_mpi, bwd ? &r->mpi_bwd_s : &r->mpi_fwd_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &best_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Bcast(&best_calls, 1, MPI_LONG, slowest.r, MPI_COMM_WORLD);
    *(bwd ? &r->bwd_s : &r->fwd_s) = slowest.v;
    r->mpi_max_s[bwd] = best_max, r->mpi_calls[bwd] = best_calls;
    return ok;
}

/* ---------------------------------------------------------------- the exchange alone */

/* The ring's messages without the compute, in the library's order (ring/ring.c): per step the
   K/V of the held shard to the next rank while it travels on; in the backward then its float32
   dK/dV sums behind it, and the finished sums of a shard whose journey ends here straight back
   to the owner. The owner keeps its own part of the sums, so they travel from the first hop on.
   Bytes are tallied to compare with ringattn_plan_get_info. Best of reps, slowest rank. */
static int held(int P, int r, int t) { return ((r - t) % P + P) % P; }

static void exchange(const void *out, size_t n_out, int to, void *in, size_t n_in, int from,
                     int tag, MPI_Request *rq, int *nrq, double *sent, double *recv) {
    if (n_in) MPI_Irecv(in, (int)n_in, MPI_BYTE, from, tag, MPI_COMM_WORLD, &rq[(*nrq)++]);
    if (n_out) MPI_Isend(out, (int)n_out, MPI_BYTE, to, tag, MPI_COMM_WORLD, &rq[(*nrq)++]);
    *sent += (double)n_out, *recv += (double)n_in;
}

static void exchange_pass(const shape_t *s, const ring_map_t *m, int bwd, char *buf[4],
                          double tally[2]) {
    const int P = m->P, r = rank_, prev = (r - 1 + P) % P;
    for (int t = 0; t < m->N; ++t) {
        MPI_Request rq[6];
        int nrq = 0;
        const int h = held(P, r, t), hp = held(P, prev, t);
        const size_t out = t < m->last_hop[h] ? (size_t)kv_bytes(s, m, h) : 0;
        const size_t in = t < m->last_hop[hp] ? (size_t)kv_bytes(s, m, hp) : 0;
        if (t + 1 < m->N) exchange(buf[0], out, (r + 1) % P, buf[1], in, prev, 0, rq, &nrq, &tally[0], &tally[1]);
        MPI_Waitall(nrq, rq, MPI_STATUSES_IGNORE), nrq = 0;
        if (!bwd) continue;
        if (t > 0 && t + 1 < m->N)
            exchange(buf[2], out, (r + 1) % P, buf[3], in, prev, 1, rq, &nrq, &tally[0], &tally[1]);
        const size_t home = t > 0 && m->last_hop[h] == t ? (size_t)kv_bytes(s, m, h) : 0;
        const size_t mine = t > 0 && m->last_hop[r] == t ? (size_t)kv_bytes(s, m, r) : 0;
        exchange(buf[2], home, h, buf[1], mine, (r + t) % P, 2, rq, &nrq, &tally[0], &tally[1]);
        MPI_Waitall(nrq, rq, MPI_STATUSES_IGNORE);
    }
}

void run_exchange(const shape_t *s, const ring_map_t *m, int reps, exch_t *x) {
    size_t big = 1;
    for (int i = 0; i < m->P; ++i) big = (size_t)kv_bytes(s, m, i) > big ? (size_t)kv_bytes(s, m, i) : big;
    char *buf[4];
    for (int i = 0; i < 4; ++i) buf[i] = xmalloc(big), memset(buf[i], 0, big);
    for (int bwd = 0; bwd < 2; ++bwd) {
        double best = INFINITY;
        for (int rep = 0; rep < reps; ++rep) {
            double tally[2] = {0, 0};
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = MPI_Wtime();
            exchange_pass(s, m, bwd, buf, tally);
            best = fmin(best, MPI_Wtime() - t0);
            x->bytes[bwd][0] = tally[0], x->bytes[bwd][1] = tally[1];
        }
        MPI_Allreduce(&best, bwd ? &x->bwd_s : &x->fwd_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    for (int i = 0; i < 4; ++i) free(buf[i]);
}

/* ---------------------------------------------------------------- the overlap table (rank 0) */

/* Two estimates of the fraction of the exchange hidden behind compute (1 = all of it, 0 =
   none, below 0 = the ring lost more than the exchange alone takes):
   from times:  (compute + exchange - ring) / exchange, compute = the threads ring minus its copies;
   from PMPI:   1 - in_mpi / exchange, in_mpi = the time the ring spent inside MPI calls, i.e.
                ring - compute measured inside the same run rather than as a difference of two. */
static double hidden_times(const overlap_t *o, int bwd, double *compute) {
    const double ring = bwd ? o->mpi->bwd_s : o->mpi->fwd_s;
    const double ex = bwd ? o->ex.bwd_s : o->ex.fwd_s;
    *compute = bwd ? o->threads->bwd_s - o->threads->copy_bwd_s : o->threads->fwd_s - o->threads->copy_fwd_s;
    return ex > 0 ? (*compute + ex - ring) / ex : NAN;
}

static double hidden_pmpi(const overlap_t *o, int bwd) {
    const double ex = bwd ? o->ex.bwd_s : o->ex.fwd_s;
    return ex > 0 ? 1.0 - (bwd ? o->mpi->mpi_bwd_s : o->mpi->mpi_fwd_s) / ex : NAN;
}

void print_overlap(const overlap_t *ov, int n) {
    printf("# overlap, zigzag: ring = the MPI ring (slowest rank); compute = the same shards over the\n"
           "# threads transport minus its in-process copies; exchange = the ring's messages alone\n"
           "# (MPI_Isend/Irecv, same bytes, same order); hidden = (compute + exchange - ring) /\n"
           "# exchange; in_mpi = time the ring spent inside MPI calls (PMPI), hid_mpi = 1 - in_mpi /\n"
           "# exchange; max_call = the longest single MPI call (a whole shard copied at once)\n");
    printf("%6s %5s %3s %4s %-8s %5s %4s %9s %10s %11s %7s %9s %7s %11s\n", "seq", "heads", "kv",
           "dim", "mask", "ranks", "pass", "ring_ms", "compute_ms", "exchange_ms", "hidden",
           "in_mpi_ms", "hid_mpi", "max_call_ms");
    for (int k = 0; k < n; ++k) {
        const overlap_t *o = &ov[k];
        char mask[32];
        mask_name(&o->s, mask, sizeof mask);
        for (int bwd = 0; bwd < 2; ++bwd) {
            double compute;
            const double h = hidden_times(o, bwd, &compute), hm = hidden_pmpi(o, bwd);
            const double ring = bwd ? o->mpi->bwd_s : o->mpi->fwd_s, ex = bwd ? o->ex.bwd_s : o->ex.fwd_s;
            const double in_mpi = bwd ? o->mpi->mpi_bwd_s : o->mpi->mpi_fwd_s;
            printf("%6d %5d %3d %4d %-8s %5d %4s %9.1f %10.1f %11.1f %7.2f %9.1f %7.2f %11.1f\n",
                   o->s.T, o->s.H, o->s.HKV, o->s.D, mask, o->mpi->P, bwd ? "bwd" : "fwd",
                   1e3 * ring, 1e3 * compute, 1e3 * ex, h, 1e3 * in_mpi, hm,
                   1e3 * o->mpi->mpi_max_s[bwd]);
            if (json)
                fprintf(json,
                        "{\"type\":\"overlap\",\"seq\":%d,\"heads\":%d,\"kv_heads\":%d,\"dim\":%d,"
                        "\"mask\":\"%s\",\"layout\":\"zigzag\",\"ranks\":%d,\"pass\":\"%s\","
                        "\"ring_ms\":%.3f,\"compute_ms\":%.3f,\"exchange_ms\":%.3f,\"hidden\":%.4f,"
                        "\"in_mpi_ms\":%.3f,\"hidden_pmpi\":%.4f,\"mpi_calls\":%ld,\"max_call_ms\":%.3f}\n",
                        o->s.T, o->s.H, o->s.HKV, o->s.D, mask, o->mpi->P, bwd ? "bwd" : "fwd",
                        1e3 * ring, 1e3 * compute, 1e3 * ex, h, 1e3 * in_mpi, hm,
                        o->mpi->mpi_calls[bwd], 1e3 * o->mpi->mpi_max_s[bwd]);
        }
        for (int bwd = 0; bwd < 2; ++bwd) /* the emulation must move what the library moves */
            if (o->ex.bytes[bwd][0] != (double)(bwd ? o->mpi->info[0].backward_bytes_sent
                                                    : o->mpi->info[0].forward_bytes_sent))
                printf("#   warning: the exchange loop sent %.0f bytes %s on rank 0, the library %zu\n",
                       o->ex.bytes[bwd][0], bwd ? "bwd" : "fwd",
                       bwd ? o->mpi->info[0].backward_bytes_sent : o->mpi->info[0].forward_bytes_sent);
    }
}

void print_overlap_figures(const overlap_t *ov, int nov) {
    for (int k = 0; k < nov; ++k) {
        const overlap_t *o = &ov[k];
        char mask[32];
        double c, h[2] = {hidden_times(o, 0, &c), hidden_times(o, 1, &c)};
        const double hm[2] = {hidden_pmpi(o, 0), hidden_pmpi(o, 1)};
        mask_name(&o->s, mask, sizeof mask);
        printf("#   exchange hidden, %s heads %d/%d: forward %.2f (PMPI) / %.2f (times), backward %.2f / "
               "%.2f; the exchange alone is %.1f%% / %.1f%% of the ring time\n", mask, o->s.H, o->s.HKV,
               hm[0], h[0], hm[1], h[1], 100.0 * o->ex.fwd_s / o->mpi->fwd_s,
               100.0 * o->ex.bwd_s / o->mpi->bwd_s);
        if (json)
            fprintf(json, "{\"type\":\"figure\",\"name\":\"hidden_%s_h%d_kv%d\",\"fwd_pmpi\":%.4f,"
                          "\"fwd_times\":%.4f,\"bwd_pmpi\":%.4f,\"bwd_times\":%.4f}\n",
                    mask, o->s.H, o->s.HKV, hm[0], h[0], hm[1], h[1]);
    }
}
