/*
 * CPU backward (SPEC 7) in one pass of 5 tile products per pair (grads.c), deterministic:
 *   tasks: (sequence, kv head, query range): each owns the dQ of its rows and sums its dK, dV
 *          (dBias) into its own partial slot (backward.h), so no sum depends on the threads;
 *   sums:  one (key tile, kv head) per task adds the slots in range order and stores dK, dV
 *          (and the tile's dBias).
 * The ranges per sequence (workspace.c) follow from the shapes alone, never from the thread
 * count: the order of every sum is fixed and the outputs are bitwise the same for any number
 * of threads (SPEC 9). Memory: the slots, ranges x (H_kv x key rows x (D + D_v) + dBias rows)
 * floats, plus O(threads x tile); the prologue's three values per query row and head.
 */
#include <math.h>
#include "kernels/cpu/threads.h"
#include <string.h>

#include "base/error.h"
#include "base/call_stream.h"
#include "kernels/cpu/backward.h"
#include "kernels/cpu/isa.h"
#include "kernels/softmax_state.h"

ra_q_side ra__load_q_side(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                          int h, int64_t qrow, int nq)
{
    ra_q_side qd;
    const int64_t at = h * p->queries->rows + qrow;
    qd.q = ra__tile_load(io->q, p->dtype, qrow, nq, h, p->head_dim, w->q, &qd.ldq);
    qd.logits_q = ra__qtile(p, qd.q, qd.ldq, nq, io->scale_q_first, w->q_scaled);
    qd.dout = ra__tile_load(io->dout, p->dtype, qrow, nq, h, p->head_dim_v, w->dout, &qd.lddo);
    qd.lse = io->lse + at;
    qd.drow = w->drow + at;
    qd.pshift = w->pshift + at;
    qd.pscale = w->pscale + at;
    return qd;
}

/*
 * The prologue of rows [qrow, qrow + nq) of head h: SPEC 7 D_i = dot(dO_i, O_i) (every tile pair
 * reads it), and SPEC 9's P = exp(s - shift) * scale: shift = LSE and scale = 1,
 * or, where LSE is lossy and the row's stats were recomputed, shift = m and scale = 1 / l.
 */
RA_CPU_CLONES static void prologue_rows(const ra_kernel_params *p, const ra_bwd_prologue_io *io,
                          ra_thread_ws *w, int h, int64_t qrow, int nq)
{
    const int Dv = p->head_dim_v;
    const int64_t at = h * p->queries->rows + qrow;
    int64_t ldo, lddo;
    const float *o = ra__tile_load(io->o, p->dtype, qrow, nq, h, Dv, w->o, &ldo);
    const float *g = ra__tile_load(io->dout, p->dtype, qrow, nq, h, Dv, w->dout, &lddo);
    const float sink = io->sinks ? io->sinks[h] : -INFINITY;
    for (int i = 0; i < nq; ++i) {
        float d = 0.0f;
        for (int c = 0; c < Dv; ++c) d += g[i * lddo + c] * o[i * ldo + c];
        w->drow[at + i] = io->dlse ? d - io->dlse[at + i] : d;
        const float lse = io->lse[at + i];
        float m = 0.0f, l = 0.0f;
        if (io->row_m) m = io->row_m[at + i], l = io->row_l[at + i];
        const int recompute = io->row_m && ra__lse_lossy(lse) && ra__row_stats_sink(&m, &l, sink);
        w->pshift[at + i] = recompute ? m : lse;
        w->pscale[at + i] = recompute ? 1.0f / l : 1.0f;
    }
}

/* SPEC 11: dsinks_h = -sum_i P_sink,i D_i over the local rows, in row order (double sums). */
static void sink_grads(const ra_kernel_params *p, const ra_bwd_prologue_io *io,
                       const struct ra_workspace *ws)
{
    const int64_t rows = p->queries->rows;
    for (int h = 0; h < p->num_heads; ++h) {
        const float sink = io->sinks ? io->sinks[h] : -INFINITY;
        double sum = 0.0;
        for (int64_t i = h * rows; i < (h + 1) * rows; ++i)
            sum -= (double)ra__sink_prob(sink, ws->pshift[i], ws->pscale[i]) * ws->drow[i];
        io->dsinks[h] = (float)sum;
    }
}

ringattn_status_t ra__cpu_backward_prologue(struct ra_workspace *ws, const ra_kernel_params *p,
                                            const ra_bwd_prologue_io *io)
{
    const int nt = ra__cpu_threads(p, ws), H = p->num_heads;
    (void)nt; /* the pragma's: unused in a build without OpenMP */
    const int64_t rows = p->queries->rows, tasks = (rows + p->block_q - 1) / p->block_q * H;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t task = 0; task < tasks; ++task) { /* each row alone: chunks of block_q rows */
        int64_t row;
        const int n = ra__row_chunk(task, H, p->block_q, rows, &row);
        prologue_rows(p, io, &ws->per_thread[omp_get_thread_num()], (int)(task % H), row, n);
    }
    if (io->dsinks) sink_grads(p, io, ws);
    return RINGATTN_SUCCESS;
}

/* One row of P and dS (before the softcap derivative): p = exp(s - shift) * scale, in place. */
static void row_probs(float *restrict ps, float *restrict dz, int nk, float shift, float scale,
                      float di)
{
    if (scale == 1.0f) { /* every row whose LSE is exact enough (SPEC 9) */
#pragma omp simd
        for (int j = 0; j < nk; ++j) {
            const float pij = ra__exp(ps[j] - shift);
            ps[j] = pij;
            dz[j] = pij * (dz[j] - di);
        }
        return;
    }
#pragma omp simd
    for (int j = 0; j < nk; ++j) {
        const float pij = ra__exp(ps[j] - shift) * scale;
        ps[j] = pij;
        dz[j] = pij * (dz[j] - di);
    }
}

RA_CPU_CLONES void ra__tile_grads(const ra_kernel_params *p, ra_thread_ws *w, int nq, int nk,
                    const ra_q_side *qd, const float *v, int64_t ldv, float *dbias)
{
    ra__cpu_gemm(w, RA_BF16, 0, 1, nq, nk, p->head_dim_v, 1.0f, qd->dout, qd->lddo, v, ldv, 0.0f,
                 w->dp, nk);
    for (int i = 0; i < nq; ++i) {
        float *ps = w->s + (size_t)i * nk, *dz = w->dp + (size_t)i * nk;
        if (ra__lse_is_empty(qd->lse[i])) { /* a row with no allowed key contributes nothing */
            memset(ps, 0, (size_t)nk * sizeof *ps);
            memset(dz, 0, (size_t)nk * sizeof *dz);
            continue;
        }
        row_probs(ps, dz, nk, qd->pshift[i], qd->pscale[i], qd->drow[i]);
        if (dbias)
#pragma omp simd
            for (int j = 0; j < nk; ++j) dbias[j] += dz[j];
        if (p->softcap > 0.0f) {
            const float *t = w->tanh_s + (size_t)i * nk;
            for (int j = 0; j < nk; ++j) dz[j] *= 1.0f - t[j] * t[j];
        }
    }
}

/* Key tile rows [krow, krow + nk) of kv head g: the slots summed in range order (into slot 0),
   stored into dK, dV. */
static void sum_key_tile(const ra_kernel_params *p, const ra_bwd_io *io, const ra_bwd_parts *s,
                         int64_t krow, int nk, int g)
{
    const int D = p->head_dim, Dv = p->head_dim_v;
    const int64_t tk = io->keys->rows;
    float *dk = ra__bwd_slot_dk(s, 0, g, tk) + krow * D, *dv = ra__bwd_slot_dv(s, 0, g, tk) + krow * Dv;
    for (int j = 1; j < s->ranges; ++j) {
        ra__cpu_add_floats(dk, ra__bwd_slot_dk(s, j, g, tk) + krow * D, (size_t)nk * D);
        ra__cpu_add_floats(dv, ra__bwd_slot_dv(s, j, g, tk) + krow * Dv, (size_t)nk * Dv);
    }
    ra__tile_store(io->dk, p->dtype, io->accumulate, krow, nk, g, D, dk, D);
    ra__tile_store(io->dv, p->dtype, io->accumulate, krow, nk, g, Dv, dv, Dv);
}

/* The same for the key tile's dBias: each bias head's rows of every slot, slot-major, into its
   first row of slot 0, stored into dBias [H_b, ld]. */
static void sum_key_tile_dbias(const ra_kernel_params *p, const ra_bwd_io *io,
                               const ra_bwd_parts *s, int64_t krow, int nk)
{
    const int64_t tk = io->keys->rows;
    const int Hb = p->bias_heads, per = s->db_rows / Hb; /* rows per bias head */
    const ra_view out = {(char *)io->dyn.dbias, 1, io->dyn.ld, sizeof(float)};
    for (int hb = 0; hb < Hb; ++hb) {
        float *db = ra__bwd_slot_db(s, 0, hb * per, tk) + krow;
        for (int j = 0; j < s->ranges; ++j)
            for (int r = hb * per + (j == 0); r < (hb + 1) * per; ++r)
                ra__cpu_add_floats(db, ra__bwd_slot_db(s, j, r, tk) + krow, (size_t)nk);
        ra__tile_store(&out, RINGATTN_FLOAT32, io->accumulate, krow, 1, hb, nk, db, nk);
    }
}

ringattn_status_t ra__cpu_attend_backward(struct ra_workspace *ws, const ra_kernel_params *p,
                                          const ra_bwd_io *io)
{
    const int nt = ra__cpu_threads(p, ws), Hk = p->num_kv_heads, J = ws->bwd_ranges;
    (void)nt; /* the pragma's: unused in a build without OpenMP */
    const ra_bwd_parts parts = {ws->bwd_dk, ws->bwd_dv,    ws->bwd_db,    J,
                                Hk,         p->head_dim, p->head_dim_v, ws->bwd_db_rows};
    const int64_t tk = io->keys->rows, tasks = (int64_t)p->num_seqs * Hk * J;
    const int64_t sums = (tk + p->keys_block - 1) / p->keys_block * Hk; /* elementwise sums */
    int blas_threads;
    ra__cpu_blas_single_thread_begin(&blas_threads);
#pragma omp parallel num_threads(nt)
    {
        ra_thread_ws *w = &ws->per_thread[omp_get_thread_num()];
        /* the last range first: under a causal mask it sees the most keys */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; ++task)
            ra__grads_task(p, io, w, &parts, (int)(task / J / Hk), (int)(task / J % Hk),
                           J - 1 - (int)(task % J));
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < sums; ++task) {
            int64_t krow;
            const int nk = ra__row_chunk(task, Hk, p->keys_block, tk, &krow);
            sum_key_tile(p, io, &parts, krow, nk, (int)(task % Hk));
            if (io->dyn.dbias && task % Hk == 0) sum_key_tile_dbias(p, io, &parts, krow, nk);
            if (omp_get_thread_num() == 0) ra__call_stream_poll(io->stream);
        }
    }
    ra__cpu_blas_single_thread_end(blas_threads);
    return RINGATTN_SUCCESS;
}
