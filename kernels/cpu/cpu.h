/*
 * CPU backend internals: per-thread tile workspace, tile loads/stores, logits of a tile and a
 * vectorisable exp. Tiles never cross a sequence; tile products go through ra__cpu_gemm (BLAS
 * sgemm, or the library's bfloat16 and float32 AVX-512 micro-kernels).
 */
#ifndef RINGATTN_KERNELS_CPU_CPU_H
#define RINGATTN_KERNELS_CPU_CPU_H

#include <stdint.h>

#include "base/view.h"
#include "kernels/backend.h"
#include "kernels/params.h"
#include "masks/mask.h"
#include "masks/topk.h"

/* Backward tasks (sequence, kv head, query range) a call aims for: the query ranges per
   sequence are ceil(this / (sequences x H_kv)), from the shapes alone (SPEC 9). */
#define RA_CPU_BWD_TASKS 8

/* One thread's tile buffers (float32), carved from one slab. */
typedef struct ra_thread_ws {
    float *q, *k, *v, *dout, *o; /* converted input tiles (unused for float32 storage) */
    float *q_scaled;             /* [block_q, D] scale * Q when it goes first (SPEC 9) */
    float *s, *dp, *tanh_s;      /* [block_q, block_k] logits/probabilities, dP/dZ, tanh */
    float *acc;                  /* [block_q, max(D, D_v)]: forward acc, dQ */
    /* a gathered batch of keys (SPEC 6 selection): */
    float *kb, *vb;              /* [keys_block, D], [keys_block, D_v]: its K, V */
    int64_t *batch_row;          /* [keys_block] (ra_key_batch) */
    int32_t *batch_pos;
    float *batch_bias;
    float *dkt, *dvt, *dbt;      /* backward: its dK [block_k, D], dV, dBias */
    float *m, *l;                /* [block_q] per-row softmax state */
    int32_t *row_begin, *row_end; /* [block_q] allowed key interval per row (masks/) */
    /* the backward prologue's results, [H, query rows], shared by every thread */
    float *drow, *pshift, *pscale;
    int bf16, f32;               /* tile products on bf16_gemm.c, f32_gemm.c (else BLAS) */
    uint32_t *pack_a, *pack_b;   /* their packed operands (NULL when unused) */
} ra_thread_ws;

struct ra_workspace {
    int threads;                /* per_thread entries: the most threads a call may use */
    ra_thread_ws *per_thread;   /* [threads] */
    /* the backward prologue (SPEC 7, 9): D_i of every local query row and the shift and scale
       of its probabilities, [H, rows] each */
    float *drow, *pshift, *pscale;
    /* the backward's partial dK, dV, dBias slots (kernels/cpu/backward.h: ra_bwd_parts), of
       bwd_floats floats: made by the first backward (ra__cpu_backward_workspace), since they
       are ranges x key rows x H_kv x (D + D_v), most of the workspace, and a plan that only
       runs forward calls would hold them for nothing */
    float *bwd_dk, *bwd_dv, *bwd_db;
    size_t bwd_floats, bwd_dk_floats, bwd_dv_floats;
    int bwd_ranges, bwd_db_rows;
    void *slab;
};

/* Made at plan creation for the tiles and threads prm holds; freed with the plan. */
ringattn_status_t ra__cpu_workspace_create(const ra_kernel_params *p, struct ra_workspace **out,
                                           size_t *bytes);
void ra__cpu_workspace_destroy(struct ra_workspace *ws);
/* The backward's slots, made at the plan's first backward call and kept (*bytes: what that
   added, 0 after); RINGATTN_ERR_OUT_OF_MEMORY, nothing changed, when there is no memory. */
ringattn_status_t ra__cpu_backward_workspace(const ra_kernel_params *p, struct ra_workspace *ws,
                                             size_t *bytes);
/* Threads of this call: the plan's num_threads or OpenMP's default, at most the workspace's. */
int ra__cpu_threads(const ra_kernel_params *p, const struct ra_workspace *ws);

/* Tasks of rows [0, rows) in chunks of `block`, times `heads`: task's first row, its rows. */
static inline int ra__row_chunk(int64_t task, int heads, int block, int64_t rows, int64_t *row0)
{
    *row0 = task / heads * block;
    return (int)(rows - *row0 < block ? rows - *row0 : block);
}

/* Memory and element work (memory.c): host memory, in the calling thread's order. */
extern const ra_memory_ops ra__host_memory;
ringattn_status_t ra__cpu_copy(const ra_copy *c, void *stream);
ringattn_status_t ra__cpu_add_f32(float *dst, const float *src, size_t n, void *stream);
/* dst[i] += src[i], i < n (the backend op above, and the backward's partial sums) */
void ra__cpu_add_floats(float *restrict dst, const float *restrict src, size_t n);
ringattn_status_t ra__cpu_scan(struct ra_workspace *ws, const ra_kernel_params *p,
                               const ra_scan_io *io, ra_scan *out);
ringattn_status_t ra__cpu_merge(const ra_merge_io *io, void *stream);
ringattn_status_t ra__cpu_state_partial(struct ra_workspace *ws, const ra_kernel_params *p,
                                        const ra_fwd_io *io, float *part);
ringattn_status_t ra__cpu_merge_f32(const ra_kernel_params *p, const float *parts, int n,
                                    size_t stride, const float *sinks, const ra_view *o,
                                    float *out_lse, void *stream);

ringattn_status_t ra__cpu_attend_forward(struct ra_workspace *ws, const ra_kernel_params *p,
                                         const ra_fwd_io *io);
ringattn_status_t ra__cpu_backward_prologue(struct ra_workspace *ws, const ra_kernel_params *p,
                                            const ra_bwd_prologue_io *io);
ringattn_status_t ra__cpu_attend_backward(struct ra_workspace *ws, const ra_kernel_params *p,
                                          const ra_bwd_io *io);

/*
 * A walk over the key tiles that query tile `item` of a tile list (masks/tiles.h, the plan's:
 * EMPTY tiles are not in it) meets; for a PARTIAL tile the allowed interval of every query row
 * is left in row_begin/row_end (masks/mask.h).
 */
typedef struct ra_tile_walk {
    const ra_kernel_params *p;
    const ra_span *mine;  /* the query tile */
    const ra_shard *keys;
    int block;
    const ra_tile_run *run, *run_end;
    int32_t next;         /* the next tile of *run */
    int32_t *row_begin, *row_end;
} ra_tile_walk;

void ra__walk_begin(ra_tile_walk *w, const ra_kernel_params *p, const ra_tile_list *list,
                    int32_t item, const ra_span *mine, const ra_shard *keys, int32_t *row_begin,
                    int32_t *row_end);
/* The next tile that meets: its positions, first local row and kind; 0 when none is left. */
int ra__walk_next(ra_tile_walk *w, ra_span *tile, int64_t *row, ra_block_kind *kind);

/*
 * Rows [row0, row0 + n) of head h as float32: a pointer into the caller's tensor for float32
 * storage (*ld = its row stride), else converted into buf (*ld = dim).
 */
const float *ra__tile_load(const ra_view *v, ringattn_dtype_t dt, int64_t row0, int n, int h,
                           int dim, float *buf, int64_t *ld);
/*
 * Writes n rows of dim float32 values (row stride ld) to rows [row0, row0 + n) of head h; with
 * accumulate, v is float32 and the values are added (dt is then ignored).
 */
void ra__tile_store(const ra_view *v, ringattn_dtype_t dt, int accumulate, int64_t row0, int n,
                    int h, int dim, const float *src, int64_t ld);

/*
 * A query tile as the left operand of the logits: alpha * data K^T, where alpha is the scale,
 * or 1 when data already holds scale * Q. SPEC 9: scaling after the sum overflows where
 * |q| |k| D exceeds the float32 range although the scaled logit does not, so a call whose
 * inputs could do that takes the scale first (io scale_q_first); others keep one rounding less.
 */
typedef struct ra_qtile {
    const float *data;
    int64_t ld;
    float alpha;
    int exact; /* data is Q as stored (not scaled): its bfloat16 rounding is exact */
} ra_qtile;

/* nq rows of Q (row stride ldq) as a logits operand: as they are, or scale * Q in buf. */
ra_qtile ra__qtile(const ra_kernel_params *p, const float *q, int64_t ldq, int nq,
                   int scale_first, float *buf);

/* SPEC 6 for one tile: the keys' bias, and the query rows' thresholds (NULL: no selection). */
typedef struct ra_tile_dyn {
    const float *bias; /* [nk] */
    const float *thr_b; /* [nq] */
    const int64_t *thr_p;
    float tmin; /* the rows' lowest threshold: keys below it are kept by no row */
    int whole;  /* every row keeps every key (lowest bias above the highest threshold) */
} ra_tile_dyn;

/*
 * SPEC 6 sparsity: with a top-k selection most keys are kept by no row of a query tile. The
 * kernels gather the keys some row may keep (bias >= the tile's lowest threshold) into batches
 * of up to block_k keys and compute only those, with the masks checked per element.
 */
typedef struct ra_key_batch {
    int n;
    int64_t *row; /* local row in the key shard */
    int32_t *pos; /* position in the sequence (cu_seqlens are int: it fits) */
    float *bias;        /* the key's bias for the head at hand */
} ra_key_batch;

static inline ra_key_batch ra__batch_of(ra_thread_ws *w)
{
    const ra_key_batch b = {0, w->batch_row, w->batch_pos, w->batch_bias};
    return b;
}

/* Appends key j of tile ks (local rows from krow; bias: the tile's) to b. */
static inline void ra__batch_add_key(ra_key_batch *b, const ra_span *ks, int64_t krow,
                                     const float *bias, int j)
{
    b->row[b->n] = krow + j;
    b->pos[b->n] = (int32_t)(ks->pos + j * ks->stride);
    b->bias[b->n++] = bias[j];
}

/*
 * Appends to b the keys of tile ks (local rows from krow), from index *j on, whose bias reaches
 * tmin, up to bk keys in b. Returns 1 when b is full (flush it and call again), 0 when the
 * tile is done.
 */
int ra__batch_fill(ra_key_batch *b, int bk, const ra_span *ks, int64_t krow, const float *bias,
                   float tmin, int *j);
/* Gathers the batch's K and V rows of kv head g into kb [n, D] and vb [n, D_v] (float32). */
void ra__batch_gather(const ra_kernel_params *p, const ra_view *k, const ra_view *v, int g,
                      const ra_key_batch *b, float *kb, float *vb);
/*
 * ra__tile_logits for a batch of keys whose K rows are gathered in w->kb: the logits of query
 * head h into w->s [nq, b->n], with the window, ALiBi and top-k checked per element from the
 * keys' positions.
 */
void ra__batch_logits(const ra_kernel_params *p, ra_thread_ws *w, int h, const ra_span *qs,
                      const ra_key_batch *b, const ra_qtile *q, float *tanh_s,
                      const ra_tile_dyn *dyn);

/*
 * SPEC 2-3 logits of a tile into w->s [nq, nk] (row stride nk): scale * Q K^T (see ra_qtile),
 * softcap (tanh values kept in tanh_s when non-NULL, for the backward), ALiBi of head h, and
 * -inf outside each row's allowed interval (w->row_begin, w->row_end) when kind is PARTIAL; with dyn, + the keys' bias
 * (SPEC 6; a selection goes through ra__batch_logits instead).
 */
void ra__tile_logits(const ra_kernel_params *p, ra_thread_ws *w, int h, const ra_span *qs,
                     const ra_span *ks, int64_t delta, ra_block_kind kind, const ra_qtile *q,
                     const float *k, int64_t ldk, float *tanh_s, const struct ra_tile_dyn *dyn);

/*
 * The dynamic-mask view of tile (query rows from qrow, keys from krow) for query head h, or NULL
 * without a bias. Returns 0 when no row keeps any key of the tile (an EMPTY tile, skipped
 * exactly): every key's bias is below every row's threshold. With a selection it also sets
 * tmin and whole (rows with fewer valid keys than keep_k, say, keep a tile whole, which then
 * takes the plain path with the bias only).
 */
int ra__tile_dyn(const ra_kernel_params *p, const ra_dyn_io *io, int h, int64_t qrow, int nq,
                 int64_t qrows, int64_t krow, int nk, struct ra_tile_dyn *out,
                 const struct ra_tile_dyn **use);


/*
 * The keys that query tile qs (local rows from qrow) of head h sees, in pieces (SPEC 3 hull,
 * SPEC 6 selection): a whole key tile for the plain path (RA_PIECE_TILE: ks, krow, kind, and
 * `use`, the bias-only view or NULL), or a batch of gathered keys that some row may keep
 * (RA_PIECE_BATCH: `batch`, with the rows' thresholds in `sel`), up to bk keys each. Shared by
 * the forward and the backward, so both take the same keys in the same order.
 */
typedef enum ra_piece { RA_PIECE_END = 0, RA_PIECE_TILE = 1, RA_PIECE_BATCH = 2 } ra_piece;

typedef struct ra_key_pieces {
    const ra_kernel_params *p;
    const ra_dyn_io *io;
    const ra_span *qs;
    int64_t qrow, qrows;
    int h, bk;
    ra_tile_walk walk;
    /* the current piece */
    ra_span ks;
    int64_t krow;
    ra_block_kind kind;
    const ra_tile_dyn *use;
    ra_tile_dyn dyn, sel;
    ra_key_batch batch;
    /* a tile being gathered from index j on (keys with bias >= dyn.tmin) */
    int filling, j, batch_out;
} ra_key_pieces;

void ra__pieces_begin(ra_key_pieces *k, const ra_kernel_params *p, const ra_dyn_io *io,
                      ra_thread_ws *w, const ra_tile_list *list, int32_t item, const ra_span *qs,
                      int64_t qrow, const ra_shard *ksh, int h);
ra_piece ra__pieces_next(ra_key_pieces *k);

/*
 * exp(x), about 1 ulp, vectorises; defined for every float: exactly 0 below -87.3 (-inf included:
 * SPEC 4's p of a masked logit), exp(88) at and above 88 (+inf included: the arguments are
 * s - max <= 0 up to rounding), NaN for NaN (SPEC 9: a NaN propagates). The exponent is built
 * in uint32 so that a NaN's bits (whatever they are) shift without overflow; for every other
 * input the bits are those of the int32 formula it replaces.
 */
static inline float ra__exp(float x)
{
    const float xc = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
    const float t = xc * 1.44269504088896341f + 12582912.0f; /* round to nearest via 1.5*2^23 */
    const float n = t - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r * r + r + 1.0f;
    union { float f; uint32_t u; } tb = {t}, sc;
    sc.u = (tb.u - 0x4B400000u + 127u) << 23; /* 2^n: n in [-126, 127] unless x is NaN */
    return x < -87.3f ? 0.0f : y * sc.f;      /* NaN: y is NaN */
}

/*
 * How a tile product may round its operands to bfloat16 (SPEC 9):
 *   RA_F32:          not at all: float32 products (an operand that is not bfloat16-exact
 *                    and whose rounding SPEC 9 does not allow: scale * Q);
 *   RA_BF16:         operands rounded to bfloat16: Q, K, V and dO (exact: bfloat16 in
 *                    storage), and P and dS at the default precision level, which rounds them
 *                    to the storage dtype as FlashAttention does;
 *   RA_BF16_SPLIT_A: A in two bfloat16 parts, its high part and what that lost (P and dS at
 *                    the high level, whose limit is 2x the error of a plain implementation
 *                    keeping P and dS in float32: rounded once, the tests' gradients came out
 *                    at up to 1.41x that limit, in dK through D_i = dO . O and O's error);
 *                    twice the work of RA_BF16, as much as a float32 product.
 */
typedef enum ra_rounding { RA_F32 = 0, RA_BF16 = 1, RA_BF16_SPLIT_A = 2 } ra_rounding;

/* The rounding of P and dS in their products at the plan's precision level (SPEC 9). */
static inline ra_rounding ra__p_rounding(const ra_kernel_params *p)
{
    return p->high_precision ? RA_BF16_SPLIT_A : RA_BF16;
}

/*
 * A tile product as cblas_sgemm computes it, row-major: C [M, N] = alpha op(A) op(B) + beta C,
 * op(X) = X^T where trans_x, beta 0 or 1: with bfloat16 operands and float32 accumulation
 * (bf16_gemm.c) where the thread's w->bf16 is set and `rounding` allows, else in float32 on
 * AVX-512 (f32_gemm.c, w->f32) or by BLAS sgemm.
 */
void ra__cpu_gemm(ra_thread_ws *w, ra_rounding rounding, int trans_a, int trans_b, int M,
                  int N, int K, float alpha, const float *A, int64_t lda, const float *B,
                  int64_t ldb, float beta, float *C, int64_t ldc);
/* The bfloat16 products (w->pack_a, w->pack_b hold ra__gemm_bf16_words for the largest
   dimension; split_a: RA_BF16_SPLIT_A) and whether this CPU runs them (AVX512-BF16). */
void ra__gemm_bf16(ra_thread_ws *w, int split_a, int trans_a, int trans_b, int M, int N, int K,
                   float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                   float beta, float *C, int64_t ldc);
int ra__gemm_bf16_supported(void);
/* Words of w->pack_a (operand_b 0, room for a split A) or w->pack_b for products whose M, N
   and K are at most max_dim. */
size_t ra__gemm_bf16_words(int max_dim, int operand_b);
/* float32 products on AVX-512 (f32_gemm.c; w->pack_a, w->pack_b hold ra__gemm_f32_floats for
   operand A, B), and whether this CPU runs them. */
void ra__gemm_f32(ra_thread_ws *w, int trans_a, int trans_b, int M, int N, int K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc);
int ra__gemm_f32_supported(void);
size_t ra__gemm_f32_floats(int max_dim, int operand_b);
/* Whether a plan of dtype dt takes the bfloat16 products here, and whether float32 products
   run on the AVX-512 kernels rather than BLAS: where BLAS's own kernels are for an older ISA
   (RINGATTN_CPU_GEMM=blas: neither; =own: both wherever the CPU runs them). */
int ra__cpu_bf16_products(ringattn_dtype_t dt);
int ra__cpu_f32_products(void);

/* BLAS runs single-threaded inside our OpenMP passes (the caller's setting is restored). */
void ra__cpu_blas_single_thread_begin(int *saved);
void ra__cpu_blas_single_thread_end(int saved);
/* Warns once (RINGATTN_LOG=warn) when OpenBLAS runs kernels far below the CPU's ISA. */
void ra__cpu_blas_check(void);


#endif
