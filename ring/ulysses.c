/*
 * The all-to-all of a 2D plan (ring/ulysses.h). The group's tensors the inner plan reads are
 * packed by rows, so what a member receives lands in place; what it sends of its own rows is
 * packed first, one slot per member in the grid's staging. Tensors laid out by heads ([H, T]:
 * LSE, the key bias) go through the staging both ways. Every copy is the backend's, in the
 * call's stream order.
 */
#include "base/error.h"
#include "comm/comm.h"
#include "ring/ulysses.h"

/* v moved by `rows` rows and `heads` heads. */
static ra_view shifted(const ra_view *v, int64_t rows, int64_t heads)
{
    ra_view s = *v;
    s.data += (size_t)(rows * v->row + heads * v->head) * v->elem;
    return s;
}

static ra_view packed(void *data, int heads, int dim, size_t elem)
{
    return (ra_view){data, (int64_t)heads * dim, dim, elem};
}

/* Staging slot i: sends 0 .. P_u - 1, receives P_u .. 2 P_u - 1, the sums' accumulator 2 P_u. */
static char *slot(const ra_grid *g, int i) { return (char *)g->stage + (size_t)i * g->stage_bytes; }

/* A member's rows of the group's tensor are one block of memory. */
static int rows_in_place(const ra_view *v, int heads, int dim)
{
    return v->row == (int64_t)heads * dim && (heads == 1 || v->head == dim);
}

static size_t piece_bytes(const ra_grid *g, const ra_ulysses_move *m, int member)
{
    return (size_t)ra__grid_rows(g, member) * g->each[m->kind] * m->dim * m->group->elem;
}

static ringattn_status_t copy(const struct ra_backend *be, const ra_ulysses_move *m,
                              const ra_grid *g, const ra_view *src, ringattn_dtype_t from,
                              const ra_view *dst, ringattn_dtype_t to, int64_t rows, void *stream)
{
    const ra_copy c = {src, dst, from, to, rows, g->each[m->kind], m->dim};
    return rows ? be->copy(&c, stream) : RINGATTN_SUCCESS;
}

ringattn_status_t ra__ulysses_to_heads(const ra_grid *g, const struct ra_backend *be,
                                       const ra_ulysses_move *m, void *stream)
{
    const int me = g->member, each = g->each[m->kind], P = g->pu;
    const int64_t n = ra__grid_rows(g, me);
    const int in_place = rows_in_place(m->group, each, m->dim);
    ra_msg send[RA_GRID_MAX_GROUP] = {{0}}, recv[RA_GRID_MAX_GROUP] = {{0}};
    for (int v = 0; v < P; ++v) { /* my rows of member v's heads: its slot, or my own place */
        const ra_view src = shifted(m->mine, 0, ra__grid_first_head(g, m->kind, v));
        const ra_view dst = v == me ? shifted(m->group, g->off[me], 0)
                                    : packed(slot(g, v), each, m->dim, m->group->elem);
        RA_TRY(copy(be, m, g, &src, m->dtype, &dst, m->dtype, n, stream));
        send[v] = (ra_msg){dst.data, v == me ? 0 : piece_bytes(g, m, me), v};
    }
    for (int w = 0; w < P; ++w) {
        void *to = in_place ? shifted(m->group, g->off[w], 0).data : slot(g, P + w);
        recv[w] = (ra_msg){to, w == me ? 0 : piece_bytes(g, m, w), w};
    }
    RA_TRY(ra__comm_alltoall(g->group, send, recv, 1, stream, m->kind));
    for (int w = 0; w < P && !in_place; ++w) {
        if (w == me) continue;
        const ra_view src = packed(slot(g, P + w), each, m->dim, m->group->elem);
        const ra_view dst = shifted(m->group, g->off[w], 0);
        RA_TRY(copy(be, m, g, &src, m->dtype, &dst, m->dtype, ra__grid_rows(g, w), stream));
    }
    return RINGATTN_SUCCESS;
}

/* Member v's part of my rows, packed float32, for a sum: what it sent, or my own rows. */
static ringattn_status_t part_f32(const ra_grid *g, const struct ra_backend *be,
                                  const ra_ulysses_move *m, int v, float **out, void *stream)
{
    const int P = g->pu, me = g->member, each = g->each[m->kind];
    *out = (float *)slot(g, P + v);
    if (v != me) return RINGATTN_SUCCESS;
    const ra_view src = shifted(m->group, g->off[me], 0);
    const ra_view dst = packed(*out, each, m->dim, sizeof(float));
    return copy(be, m, g, &src, RINGATTN_FLOAT32, &dst, RINGATTN_FLOAT32, ra__grid_rows(g, me),
                stream);
}

/* Replicated heads: each set of members sharing a head sums its parts in member order. */
static ringattn_status_t sum_replicated(const ra_grid *g, const struct ra_backend *be,
                                        const ra_ulysses_move *m, void *stream)
{
    const int P = g->pu, each = g->each[m->kind], share = P / g->heads[m->kind];
    const int64_t n = ra__grid_rows(g, g->member);
    const size_t count = (size_t)n * each * m->dim;
    float *acc = (float *)slot(g, 2 * P), *part;
    const ra_view sum = packed(acc, each, m->dim, sizeof(float));
    for (int v0 = 0; v0 < P; v0 += share) {
        RA_TRY(part_f32(g, be, m, v0, &part, stream));
        const ra_view first = packed(part, each, m->dim, sizeof(float));
        RA_TRY(copy(be, m, g, &first, RINGATTN_FLOAT32, &sum, RINGATTN_FLOAT32, n, stream));
        for (int v = v0 + 1; v < v0 + share; ++v) {
            RA_TRY(part_f32(g, be, m, v, &part, stream));
            if (count) RA_TRY(be->add_f32(acc, part, count, stream));
        }
        const ra_view dst = shifted(m->mine, 0, ra__grid_first_head(g, m->kind, v0));
        RA_TRY(copy(be, m, g, &sum, RINGATTN_FLOAT32, &dst, m->dtype, n, stream));
    }
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__ulysses_to_tokens(const ra_grid *g, const struct ra_backend *be,
                                        const ra_ulysses_move *m, void *stream)
{
    const int me = g->member, each = g->each[m->kind], P = g->pu;
    const int64_t n = ra__grid_rows(g, me);
    const int in_place = rows_in_place(m->group, each, m->dim);
    ra_msg send[RA_GRID_MAX_GROUP] = {{0}}, recv[RA_GRID_MAX_GROUP] = {{0}};
    for (int w = 0; w < P; ++w) { /* member w's rows of my heads */
        const ra_view src = shifted(m->group, g->off[w], 0);
        void *from = src.data;
        if (!in_place && w != me) {
            const ra_view dst = packed(slot(g, w), each, m->dim, m->group->elem);
            RA_TRY(copy(be, m, g, &src, m->group_dtype, &dst, m->group_dtype,
                        ra__grid_rows(g, w), stream));
            from = dst.data;
        }
        send[w] = (ra_msg){from, w == me ? 0 : piece_bytes(g, m, w), w};
        recv[w] = (ra_msg){slot(g, P + w), w == me ? 0 : piece_bytes(g, m, me), w};
    }
    RA_TRY(ra__comm_alltoall(g->group, send, recv, 1, stream, m->kind));
    if (ra__grid_replicated(g, m->kind)) return sum_replicated(g, be, m, stream);
    for (int v = 0; v < P; ++v) {
        const ra_view src = v == me ? shifted(m->group, g->off[me], 0)
                                    : packed(slot(g, P + v), each, m->dim, m->group->elem);
        const ra_view dst = shifted(m->mine, 0, ra__grid_first_head(g, m->kind, v));
        RA_TRY(copy(be, m, g, &src, m->group_dtype, &dst, m->dtype, n, stream));
    }
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__ulysses_gather_heads(const ra_grid *g, const struct ra_backend *be,
                                           const ra_ulysses_move *m, void *stream)
{
    const int me = g->member, each = g->each[m->kind], P = g->pu;
    const int64_t n = g->rows;
    const size_t bytes = (size_t)n * each * m->dim * m->mine->elem;
    ra_msg send[RA_GRID_MAX_GROUP] = {{0}}, recv[RA_GRID_MAX_GROUP] = {{0}};
    const ra_view own = shifted(m->mine, 0, ra__grid_first_head(g, m->kind, me));
    const ra_view out = packed(slot(g, 0), each, m->dim, m->mine->elem); /* to every member */
    RA_TRY(copy(be, m, g, &own, m->dtype, &out, m->dtype, n, stream));
    for (int v = 0; v < P; ++v) {
        send[v] = (ra_msg){out.data, v == me ? 0 : bytes, v};
        recv[v] = (ra_msg){slot(g, P + v), v == me ? 0 : bytes, v};
    }
    RA_TRY(ra__comm_alltoall(g->group, send, recv, 1, stream, m->kind));
    for (int v = 0; v < P; ++v) {
        if (v == me) continue;
        const ra_view src = packed(slot(g, P + v), each, m->dim, m->mine->elem);
        const ra_view dst = shifted(m->mine, 0, ra__grid_first_head(g, m->kind, v));
        RA_TRY(copy(be, m, g, &src, m->dtype, &dst, m->dtype, n, stream));
    }
    return RINGATTN_SUCCESS;
}
