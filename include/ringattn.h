/*
 * ringattn: exact sequence-parallel ("ring") flash attention, plain C API.
 *
 * The numerical contract (logits, masks, guarded softmax state, merge, backward, layouts,
 * tolerances) is docs/SPEC.md; section numbers in comments ("SPEC 4") refer to it.
 *
 * Every function validates its arguments, returns a status, writes nothing on failure and
 * leaves a message for ringattn_last_error(). Nothing aborts, exits or throws.
 *
 * Structs that begin with struct_size (ringattn_plan_desc_t, ringattn_tensors_t,
 * ringattn_plan_info_t) grow only at their end. A program built against an older header passes
 * its smaller struct_size and keeps working: fields it does not have take their defaults (those
 * of the _INIT macros), and an info struct gets only the fields it has. A struct_size that is
 * no released size of the struct (a newer, larger one, say) is RINGATTN_ERR_INVALID_ARGUMENT.
 */
#ifndef RINGATTN_H
#define RINGATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define RINGATTN_API
#elif defined(RINGATTN_BUILDING)
#define RINGATTN_API __attribute__((visibility("default")))
#else
#define RINGATTN_API
#endif

#define RINGATTN_VERSION_MAJOR 0
#define RINGATTN_VERSION_MINOR 6
#define RINGATTN_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, as ringattn_version() returns at run time. */
#define RINGATTN_VERSION \
    (RINGATTN_VERSION_MAJOR * 10000 + RINGATTN_VERSION_MINOR * 100 + RINGATTN_VERSION_PATCH)

typedef enum ringattn_status {
    RINGATTN_SUCCESS = 0,
    RINGATTN_ERR_INVALID_ARGUMENT, /* a value is out of its documented range */
    RINGATTN_ERR_INVALID_USAGE,    /* calls in the wrong order, a destroyed plan, ... */
    RINGATTN_ERR_UNSUPPORTED,      /* valid, but this build or backend cannot do it */
    RINGATTN_ERR_OUT_OF_MEMORY,
    RINGATTN_ERR_COMM,
    RINGATTN_ERR_CUDA,
    RINGATTN_ERR_INTERNAL
} ringattn_status_t;

/* The status in words ("invalid argument") and its enumerator's name
   ("RINGATTN_ERR_INVALID_ARGUMENT"); for a value that is no status, "unknown status" and
   "RINGATTN_STATUS_UNKNOWN". */
RINGATTN_API const char *ringattn_status_string(ringattn_status_t status);
RINGATTN_API const char *ringattn_status_name(ringattn_status_t status);
/* Message of the last failure on the calling thread ("" if none). Valid until the next call. */
RINGATTN_API const char *ringattn_last_error(void);
RINGATTN_API int ringattn_version(void);
RINGATTN_API const char *ringattn_version_string(void);
/* The instruction set the CPU backend's element-wise loops run on in this process, in words (a
   build with RINGATTN_NATIVE=OFF picks it at load time), and what bfloat16 plans' tile
   products run on (AVX512-BF16 micro-kernels where the CPU has them; float32 products are
   BLAS's own). */
RINGATTN_API const char *ringattn_cpu_kernels(void);
/* What this build has, in words: "backends: cpu[, cuda]; transports: threads, custom[,
   threads_device][, mpi][, nccl], simulated" (ringattn-info prints it). */
RINGATTN_API const char *ringattn_build_info(void);

/*
 * Logging (README, "Logging"). By default lines go to stderr, or to RINGATTN_LOG_FILE, at the
 * level RINGATTN_LOG names (default warn), from the subsystems RINGATTN_LOG_SUBSYS keeps. A
 * callback takes every line up to `level` instead (RINGATTN_LOG_SUBSYS still filters): the
 * subsystem ("plan", "ring", "comm" or "kernels"), the rank and ranks of the comm the line is
 * about (-1 and 0: none), the message without prefix or newline, valid during the call. It is
 * called on the thread that logs, never two at once, and must not call ringattn. fn NULL: back
 * to stderr or the file at RINGATTN_LOG's level.
 */
typedef enum ringattn_log_level {
    RINGATTN_LOG_OFF = 0,
    RINGATTN_LOG_WARN = 1,  /* failures (each failed call's message), resources left behind */
    RINGATTN_LOG_INFO = 2,  /* a plan's shape, schedule, traffic, tiles and memory; kernels */
    RINGATTN_LOG_DEBUG = 3, /* per call decisions (steps skipped by top-k) */
    RINGATTN_LOG_TRACE = 4  /* everything */
} ringattn_log_level_t;
typedef void (*ringattn_log_fn)(void *user, ringattn_log_level_t level, const char *subsystem,
                                int rank, int ranks, const char *message);
RINGATTN_API ringattn_status_t ringattn_set_log_callback(ringattn_log_fn fn, void *user,
                                                         ringattn_log_level_t level);

typedef enum ringattn_dtype {
    RINGATTN_FLOAT32 = 0,
    RINGATTN_FLOAT16 = 1,
    RINGATTN_BFLOAT16 = 2
} ringattn_dtype_t;

/* How P ranks split every sequence (SPEC 8). Meaningful once a comm is given. */
typedef enum ringattn_layout {
    RINGATTN_LAYOUT_CONTIGUOUS = 0,
    RINGATTN_LAYOUT_ZIGZAG = 1,
    RINGATTN_LAYOUT_STRIPED = 2
} ringattn_layout_t;

/* Which kernels a plan runs on. AUTO: the CPU (a plan is made before any tensor is seen, so
   it cannot follow where the tensors live); CUDA must be asked for. A backend this build lacks
   is RINGATTN_ERR_UNSUPPORTED at plan creation. */
typedef enum ringattn_backend {
    RINGATTN_BACKEND_AUTO = 0,
    RINGATTN_BACKEND_CPU = 1,
    RINGATTN_BACKEND_CUDA = 2
} ringattn_backend_t;

/* How a float16 / bfloat16 plan rounds the probabilities P and the logit gradients dS before
   the products that read them (SPEC 9; float32 plans are not affected). DEFAULT rounds them to
   the storage dtype as FlashAttention, cuDNN and PyTorch's SDPA do (error at most 2x such a
   plain flash implementation's); HIGH keeps them at float32 precision (error at most 2x a
   plain float32-arithmetic implementation's without that rounding), at up to twice the work of
   those products where they run in 16 bits. */
typedef enum ringattn_precision {
    RINGATTN_PRECISION_DEFAULT = 0,
    RINGATTN_PRECISION_HIGH = 1
} ringattn_precision_t;

typedef struct ringattn_comm *ringattn_comm_t; /* who is in the ring, how bytes move */
typedef struct ringattn_plan *ringattn_plan_t; /* shapes, masks, schedule, workspace */

/* What to compute. Initialise with RINGATTN_PLAN_DESC_INIT, then set fields. */
typedef struct ringattn_plan_desc {
    size_t struct_size;
    int num_heads;    /* H: query heads */
    int num_kv_heads; /* H_kv: H % H_kv == 0 (GQA/MQA); 0 means H */
    int head_dim;     /* D of Q and K: 1..256 */
    int head_dim_v;   /* D_v of V and O: 1..256; 0 means D */
    ringattn_dtype_t dtype;
    ringattn_layout_t layout;
    int num_seqs;                /* 0..INT32_MAX - 1 */
    const int32_t *cu_seqlens;   /* [num_seqs + 1] query boundaries, host memory, copied */
    const int32_t *cu_seqlens_k; /* key boundaries, or NULL for the same as cu_seqlens.
                                    Keys may outnumber queries (KV cache): bottom-right aligned */
    int causal;                  /* nonzero: window_right = 0 (SPEC 3) */
    int window_left, window_right; /* -1 = unbounded on that side */
    float softmax_scale;         /* 0: 1/sqrt(head_dim); else at most FLT_MAX / (2 head_dim) */
    float softcap;               /* 0: off; else a normal float (>= FLT_MIN) */
    const float *alibi_slopes;   /* [num_heads] or NULL; copied. Each finite, with |slope| times
                                    the longest sequence (max(L_q, L_k) - 1) <= FLT_MAX / 2 */
    /* Dynamic mask attention (SPEC 6): a float32 bias per key, [key_bias_heads, T_k], added to
       the logits (not scaled); query head h reads bias head h / (H / key_bias_heads). 0 = no
       bias; else 1, num_kv_heads or num_heads. keep_k > 0 (needs a bias): each query keeps only
       the keep_k valid keys of largest bias over its whole sequence (ties: lower position). */
    int key_bias_heads, keep_k;
    int block_q, block_k;        /* tile sizes in tokens, 0..1024, 0 = the backend's choice
                                    (ringattn_plan_get_info reports it) */
    int num_threads;             /* CPU threads of a call, 0 = OpenMP's default at the call;
                                    never more than when the plan was made (its workspace) */
    /* since 0.2 */
    ringattn_backend_t backend;  /* default AUTO */
    int device;                  /* CUDA device ordinal; -1 (default): the current one. The CPU
                                    backend takes -1 or 0. Not part of the descriptor agreement */
    /* since 0.3: inference against a KV cache (README, "Inference"). Such plans are forward
       only (ringattn_backward: RINGATTN_ERR_UNSUPPORTED). */
    int sharded_cache;           /* nonzero: the keys of cu_seqlens_k are a KV cache split across
                                    the comm's ranks (by layout, or by cache_bounds), and the
                                    queries of cu_seqlens are the same on every rank (decode,
                                    chunked prefill). Each rank attends every query to its own
                                    cache slots in place; only the (O, LSE) partials move (SPEC
                                    5), and every rank gets the whole O and LSE. No comm: one
                                    rank holding the whole cache */
    const int32_t *cache_bounds; /* with sharded_cache, or NULL: [num_seqs * (ranks + 1)], rank r
                                    holds key positions [b[s * (ranks + 1) + r], b[s * (ranks +
                                    1) + r + 1]) of sequence s (b[s * (ranks + 1)] = 0, the last
                                    = its key length, non-decreasing); copied. NULL: by layout */
    const int32_t *cu_seqlens_new; /* [num_seqs + 1] or NULL: new tokens' K/V (tensors k_new,
                                    v_new), not yet in the cache, attended after each sequence's
                                    cached keys as if appended to them: sequence s has L_k =
                                    cached + new keys. In a sharded cache the last rank attends
                                    them (only its k_new, v_new are read) */
    /* since 0.4 */
    ringattn_precision_t precision; /* default DEFAULT (SPEC 9) */
    /* since 0.6: two-dimensional context parallelism (README, "2D context parallelism";
       DESIGN, "Ulysses inside a group, the ring across groups"). P_u: 0 or 1 is a flat ring
       over the comm. Else the comm's P ranks form P / P_u groups of P_u consecutive ranks
       (group g: ranks g P_u .. g P_u + P_u - 1, as the GPUs of a node are numbered; other
       groupings: ringattn_plan_create_2d). Inside a group an all-to-all trades the sequence for
       the heads: each rank attends H / P_u query heads over its group's tokens, on a ring of
       the P / P_u ranks at its place in every group. The layout splits the tokens among the
       groups; a group's tokens are then split among its ranks in P_u consecutive pieces
       (ringattn_plan_local_tokens). Needs P % P_u == 0, H % P_u == 0, and H_kv % P_u == 0 or
       P_u % H_kv == 0 (then each kv head is replicated on P_u / H_kv ranks of a group). With
       sharded_cache the cache is split among the groups (by layout, or cache_bounds of
       num_seqs (P / P_u + 1) entries) and its heads among a group's ranks: each rank passes
       every query's Q and gets every head's O and LSE, but passes K, V, k_new, v_new and the
       key bias of its group's slots for only its own kv heads (key bias heads), those of
       member m being heads m (H / P_u) h / H onwards for a tensor of h heads. */
    int ulysses_size;
    /* nonzero: the groups are strided instead, group g being ranks g, g + P / P_u, g + 2 P /
       P_u, ... (a launcher that numbers ranks node after node in round robin). */
    int ulysses_strided;
} ringattn_plan_desc_t;

#define RINGATTN_PLAN_DESC_INIT                                                              \
    {                                                                                       \
        sizeof(ringattn_plan_desc_t), 0, 0, 0, 0, RINGATTN_FLOAT32, RINGATTN_LAYOUT_CONTIGUOUS, \
            0, NULL, NULL, 0, -1, -1, 0.0f, 0.0f, NULL, 0, 0, 0, 0, 0, RINGATTN_BACKEND_AUTO, -1, \
            0, NULL, NULL, RINGATTN_PRECISION_DEFAULT, 0, 0                                 \
    }

/*
 * A [T, heads, dim] tensor: element (t, h, c) is at data[t * row_stride + h * head_stride + c]
 * counted in elements of the plan's dtype. Strides of 0 mean packed: head_stride = dim,
 * row_stride = heads * dim. A stride of 0 is never a broadcast: a view that repeats one row or
 * head (a stride of 0 over more than one element, as torch's expand or numpy's broadcast_to
 * make) must be copied to memory of its own first, or the library reads beyond it; the Python
 * package copies such inputs and refuses such outputs. The last element must lie within
 * INT64_MAX bytes of the first (else RINGATTN_ERR_INVALID_ARGUMENT), and row_stride (given or
 * packed) is at most INT32_MAX (else RINGATTN_ERR_UNSUPPORTED: BLAS takes int strides);
 * head_stride may be larger.
 */
typedef struct ringattn_tensor {
    void *data;
    int64_t row_stride;
    int64_t head_stride;
} ringattn_tensor_t;

typedef struct ringattn_tensors {
    size_t struct_size;
    ringattn_tensor_t q, k, v;  /* inputs: [T_q, H, D], [T_k, H_kv, D], [T_k, H_kv, D_v] */
    ringattn_tensor_t o;        /* forward output, backward input: [T_q, H, D_v] */
    float *lse;                 /* [H, T_q] float32: forward output, backward input */
    ringattn_tensor_t dout;     /* backward input dO: [T_q, H, D_v] */
    ringattn_tensor_t dq, dk, dv; /* backward outputs, overwritten */
    /* [key_bias_heads, T_k] float32, packed; NULL without a bias. Finite or -inf (a key no row
       uses); a NaN or +inf is refused with RINGATTN_ERR_INVALID_ARGUMENT. */
    const float *key_bias;
    float *dbias;               /* backward output [key_bias_heads, T_k], or NULL: not wanted */
    /* since 0.3: the new tokens' K/V of a plan with cu_seqlens_new ([T_new, H_kv, D], [T_new,
       H_kv, D_v]) and, with a key bias, their bias [key_bias_heads, T_new]. T_k above counts
       the cache's keys (this rank's slots in a sharded cache). */
    ringattn_tensor_t k_new, v_new;
    const float *key_bias_new;
    /* since 0.5 (SPEC 11), float32, NULL: none. sinks [num_heads]: a sink logit per query
       head, which joins every row's softmax once as a key of value 0 (gpt-oss, StreamingLLM);
       -inf is no sink for that head, NaN or +inf make its rows NaN. LSE (forward output,
       backward input) then counts the sink. A ring adds it on the rank that holds the row, a
       sharded KV cache at the partials' merge. dsinks [num_heads]: backward output, this rank's
       part (its local rows: sum it over the ranks as any replicated parameter's gradient).
       dlse [num_heads, T_q]: backward input, the gradient of the loss by LSE, for callers that
       use LSE beyond the backward (NULL: zero). In the backend's memory as the tensors. */
    const float *sinks;
    float *dsinks;
    const float *dlse;
} ringattn_tensors_t;

#define RINGATTN_TENSOR_NONE {NULL, 0, 0}
#define RINGATTN_TENSORS_INIT                                                                 \
    {                                                                                        \
        sizeof(ringattn_tensors_t), RINGATTN_TENSOR_NONE, RINGATTN_TENSOR_NONE,              \
            RINGATTN_TENSOR_NONE, RINGATTN_TENSOR_NONE, NULL, RINGATTN_TENSOR_NONE,          \
            RINGATTN_TENSOR_NONE, RINGATTN_TENSOR_NONE, RINGATTN_TENSOR_NONE, NULL, NULL,    \
            RINGATTN_TENSOR_NONE, RINGATTN_TENSOR_NONE, NULL, NULL, NULL, NULL               \
    }

/*
 * Communicators. A comm says who is in the ring and how bytes move (include/ringattn_mpi.h
 * makes one from an MPI communicator). The threads transport runs num_ranks ranks as threads
 * of this process: comms[r] is rank r's handle, used by one thread; destroy each.
 */
RINGATTN_API ringattn_status_t ringattn_comm_create_threads(int num_ranks, ringattn_comm_t *comms);
/*
 * The same for plans of the CUDA backend, every rank on one device (-1: the current one): the
 * ring's shards move as device-to-device copies on a comm stream of each rank, ordered by
 * events with the stream each call runs on, with no host wait (a multi-rank ring on one GPU,
 * where NCCL refuses two ranks). Give each rank's calls their own stream to overlap the
 * copies with the kernels. A plan checks that its comm moves its backend's memory.
 * RINGATTN_ERR_UNSUPPORTED in builds without CUDA.
 */
RINGATTN_API ringattn_status_t ringattn_comm_create_threads_device(int num_ranks, int device,
                                                                   ringattn_comm_t *comms);
/*
 * The MPI transport (include/ringattn_mpi.h) from a Fortran communicator handle, for callers
 * without mpi.h (Python through ctypes: mpi4py's comm.py2f()): the same as
 * ringattn_comm_create_mpi(MPI_Comm_f2c(fortran_comm), comm), collective over that communicator.
 * The handle must come from the MPI this library was built with (mpi4py built against it).
 * RINGATTN_ERR_INVALID_ARGUMENT for a value outside int range, MPI_COMM_NULL or one the MPI knows
 * names no communicator (Open MPI can tell; an MPI whose C handles are the values themselves
 * cannot, and fails as for any invalid handle); RINGATTN_ERR_INVALID_USAGE before MPI_Init or
 * after MPI_Finalize; RINGATTN_ERR_UNSUPPORTED in builds without MPI. Nothing written on failure.
 * A transport of the caller's (torch.distributed, say): include/ringattn_transport.h.
 */
RINGATTN_API ringattn_status_t ringattn_comm_create_mpi_fortran(int64_t fortran_comm,
                                                                ringattn_comm_t *comm);
/*
 * Failure semantics of collective calls (plan creation, forward, backward; docs/DESIGN.md,
 * "Failure semantics"). A call never returns success on one rank while it failed on another,
 * and never pairs with another call of a peer.
 * - Arguments refused on some rank, or ranks in different calls (a rank that passed a NULL or
 *   destroyed plan and went on to its next call, a forward meeting a backward, another plan):
 *   RINGATTN_ERR_INVALID_ARGUMENT / _INVALID_USAGE on every rank, at once. The comm and plans
 *   stay usable and the next call pairs up again: every rank may retry.
 * - RINGATTN_ERR_COMM: a transport error, or no progress for RINGATTN_COMM_TIMEOUT seconds
 *   (default 60; a slow link that still moves is not an error). The comm has failed on every
 *   rank: every later call on it or its plans fails at once with RINGATTN_ERR_COMM. Destroy its
 *   plans and the comm, then create a new comm (on every rank) to go on. Buffers the transport
 *   may still use are left allocated rather than freed under it (logged).
 */
RINGATTN_API ringattn_status_t ringattn_comm_rank(ringattn_comm_t comm, int *rank, int *size);
/* NULL is a no-op. */
RINGATTN_API ringattn_status_t ringattn_comm_destroy(ringattn_comm_t comm);
/*
 * A simulated world: the comm of rank `rank` of `size` ranks with no peers behind it, to make
 * the plan rank would get and read its schedule, traffic and memory (ringattn_plan_get_info;
 * ringattn-info) for any size, on one machine, without data. Its agreements see every rank
 * pass what this rank passes; plans on it are refused by ringattn_forward and
 * ringattn_backward (RINGATTN_ERR_UNSUPPORTED, nothing written). Not collective.
 */
RINGATTN_API ringattn_status_t ringattn_comm_create_simulated(int rank, int size,
                                                              ringattn_comm_t *comm);

/*
 * comm == NULL: one rank (plain flash attention with every mask; also the local API).
 * Otherwise collective over comm: every rank passes the same descriptor (checked: a mismatch
 * fails on every rank) and gets a plan for its own tokens under desc->layout.
 */
RINGATTN_API ringattn_status_t ringattn_plan_create(ringattn_comm_t comm,
                                                    const ringattn_plan_desc_t *desc,
                                                    ringattn_plan_t *plan);
/*
 * A 2D plan (desc->ulysses_size) over two comms of the caller's: group_comm, the P_u ranks of
 * this rank's group (the all-to-all: NVLink inside a node), and ring_comm, the P_r ranks at
 * this rank's place in every group (the ring: between nodes). Rank g of ring_comm's group is
 * group g; the grid's rank is (ring rank) P_u + (group rank). Collective over both: every rank
 * of the P_u P_r calls it with the same descriptor. desc->ulysses_size must be 0 or P_u. Both
 * comms must be of one kind of memory (host, or the plan's device) and stay alive until the
 * plan is destroyed. A failure of either fails the calls of every rank.
 */
RINGATTN_API ringattn_status_t ringattn_plan_create_2d(ringattn_comm_t group_comm,
                                                       ringattn_comm_t ring_comm,
                                                       const ringattn_plan_desc_t *desc,
                                                       ringattn_plan_t *plan);
/*
 * The tokens this rank holds, in local row order: *count of them, and when global_index is not
 * NULL (an array of *count entries, ask for the count first) the index of each in the global
 * packed batch described by cu_seqlens. Local Q, K, V, O, dO, dQ, dK, dV rows follow this
 * order; a single-rank plan holds every query token in order.
 */
RINGATTN_API ringattn_status_t ringattn_plan_local_tokens(ringattn_plan_t plan, int64_t *count,
                                                          int32_t *global_index);
/*
 * The keys this rank holds: *count of them and, when global_index is not NULL, the index of each
 * in the packed batch of cu_seqlens_k (its K and V rows follow this order). A ring holds its
 * query tokens (ringattn_plan_local_tokens); a sharded cache this rank's slots; one rank every
 * key. The new tokens' K/V (cu_seqlens_new) are not counted.
 */
RINGATTN_API ringattn_status_t ringattn_plan_local_keys(ringattn_plan_t plan, int64_t *count,
                                                        int32_t *global_index);
/*
 * What a plan will do on this rank and what it holds: its schedule, traffic, tiles and memory
 * (also logged at RINGATTN_LOG=info). The memory is made at plan creation, but for the CPU
 * backend's backward slots (ranges x key rows x H_kv x (D + D_v) float32, ranges at most 8),
 * which the plan's first ringattn_backward makes and keeps; other calls allocate nothing.
 */
typedef struct ringattn_plan_info {
    size_t struct_size;           /* set by RINGATTN_PLAN_INFO_INIT */
    int rank, ranks;
    int64_t local_tokens;
    /* ring steps (<= ranks): after them no rank needs a farther shard */
    int num_steps;
    int compute_steps;            /* steps in which this rank computes (the others are EMPTY) */
    /* K/V shards and their float32 sums moved per call (the key bias is counted below) */
    size_t forward_bytes_sent, forward_bytes_received;   /* per forward call */
    size_t backward_bytes_sent, backward_bytes_received; /* per backward call */
    /* since 0.2 */
    ringattn_backend_t backend;   /* the backend the plan runs on (never AUTO) */
    int device;                   /* its device, -1 for the CPU */
    int block_q, block_k;         /* tile sizes the backend decided */
    size_t bias_bytes_received;   /* per call: the other ranks' key bias (gathered once) */
    size_t workspace_bytes;       /* the kernels' workspace, in the backend's memory */
    size_t buffer_bytes;          /* the ring's buffers (shards, sums, state), backend memory */
    size_t host_bytes;            /* host memory besides (token maps, schedule, selection) */
    size_t memory_bytes;          /* everything the plan holds: the three above */
    /* since 0.6: a 2D plan (ulysses_size > 1; a flat ring has 1 and ranks). rank and ranks
       above are then the whole grid's, num_steps and compute_steps the ring's, and the
       forward_/backward_bytes above what moves on the ring (between groups). The all-to-all
       inside the group moves alltoall_* bytes per call (this rank's, to and from the other
       ranks of its group): Q, K, V (and key bias) in and O, LSE out in a forward; Q, K, V, O,
       dO, LSE (and key bias) in and dQ, dK, dV (and dBias) out in a backward, dK and dV in
       float32 where kv heads are replicated; a dLSE, when given, adds 4 bytes per head and
       token like LSE. */
    int ulysses_size, ring_size;
    size_t alltoall_forward_bytes_sent, alltoall_forward_bytes_received;
    size_t alltoall_backward_bytes_sent, alltoall_backward_bytes_received;
} ringattn_plan_info_t;

#define RINGATTN_PLAN_INFO_INIT \
    {sizeof(ringattn_plan_info_t), 0, 0, 0, 0, 0, 0, 0, 0, 0, RINGATTN_BACKEND_AUTO, -1, 0, 0, 0, \
     0, 0, 0, 0, 1, 1, 0, 0, 0, 0}

RINGATTN_API ringattn_status_t ringattn_plan_get_info(ringattn_plan_t plan,
                                                      ringattn_plan_info_t *info);

/*
 * Layout helpers, so that callers need not re-derive SPEC 8. scatter copies this rank's rows of
 * a global [T, heads, dim] tensor (T = cu_seqlens[num_seqs]) into a local [T_local, heads, dim]
 * one; gather writes a local tensor's rows into their places in a global one (other rows are
 * left as they are: combine the ranks' pieces with your own allgather or reduction). Tensors
 * are of `dtype` in host memory, strides as in ringattn_tensor_t. An LSE [H, T] is dtype
 * RINGATTN_FLOAT32, heads = H, dim = 1, row_stride = 1 and head_stride = T (global) or T_local
 * (local).
 */
RINGATTN_API ringattn_status_t ringattn_plan_scatter(ringattn_plan_t plan, ringattn_dtype_t dtype,
                                                     int heads, int dim, ringattn_tensor_t global,
                                                     ringattn_tensor_t local);
RINGATTN_API ringattn_status_t ringattn_plan_gather(ringattn_plan_t plan, ringattn_dtype_t dtype,
                                                    int heads, int dim, ringattn_tensor_t local,
                                                    ringattn_tensor_t global);
/*
 * O and LSE from Q, K, V. stream: NULL on the CPU backend (the call returns when its outputs are
 * written).
 *
 * The CUDA backend (desc.backend = RINGATTN_BACKEND_CUDA; one rank, or a ring over a comm of
 * ringattn_comm_create_threads_device or over NCCL, include/ringattn_nccl.h):
 * - Tensors, lse and key_bias are device memory of the plan's device (else RINGATTN_ERR_CUDA);
 *   Q, K and V start 16-byte aligned with strides in whole 16 bytes (8 elements of float16 or
 *   bfloat16, 4 of float32), else RINGATTN_ERR_UNSUPPORTED. Head dims: multiples of 8 (float32:
 *   4) up to 256. Tile sizes are the kernels' (block_q, block_k 0).
 * - stream is a cudaStream_t (NULL: the legacy default stream). The call is stream-ordered: it
 *   enqueues its work on stream and returns without waiting for the device, so the caller may
 *   overlap it. A single-rank call without a key bias makes no host wait, so it is meant to be
 *   capturable in a CUDA graph (not yet checked on a GPU); the others wait on the host (below),
 *   and on a capturing stream they are RINGATTN_ERR_UNSUPPORTED, nothing queued. Its inputs must stay unchanged, and its outputs
 *   unread, until that work has run (an event recorded on stream after the call); no buffer may
 *   be freed before. The plan owns device memory (its parameters, workspace and state), made at
 *   plan creation and freed by ringattn_plan_destroy, which synchronises the device; calls
 *   allocate nothing. Calls on one plan must be ordered with each other (one stream, or events).
 * - A key bias makes the call wait for the stream: the bias is checked (SPEC 6) and the top-k
 *   thresholds computed on the host.
 * - An error the device reports (a fault in an earlier call's kernels, a launch failure) is
 *   RINGATTN_ERR_CUDA with the runtime's message, at the first call that sees it; after a fault
 *   the CUDA context is unusable, as for every CUDA library.
 * - ringattn_backward follows the same contract (deterministic: repeated calls give the same
 *   bits).
 * - In a ring the call also waits once for its stream, for the call's agreement (SPEC 9: the
 *   maxima of Q and K, and in the backward whether any LSE row is lossy, reach the host);
 *   the shards then move on the transport's streams, ordered with stream by events, without a
 *   host wait. A comm that moves host memory (threads, MPI) is RINGATTN_ERR_UNSUPPORTED for a
 *   CUDA plan at plan creation, as is a device comm for a CPU plan. Over NCCL
 *   (include/ringattn_nccl.h) the call's closing agreement is a host wait too.
 */
RINGATTN_API ringattn_status_t ringattn_forward(ringattn_plan_t plan, const ringattn_tensors_t *t,
                                                void *stream);
/* dQ, dK, dV from Q, K, V, O, LSE, dO (SPEC 7). */
RINGATTN_API ringattn_status_t ringattn_backward(ringattn_plan_t plan,
                                                 const ringattn_tensors_t *t, void *stream);
/* NULL is a no-op. */
RINGATTN_API ringattn_status_t ringattn_plan_destroy(ringattn_plan_t plan);

/*
 * SPEC 5: merge num_partials normalised partials (O_s [T, H, D_v], LSE_s [H, T]) of attention
 * over disjoint key sets into out_o / out_lse. An LSE of -inf (or +inf, FlashAttention 2's
 * marker of an empty row) is an empty partial whose O is never read into the result. The
 * outputs may alias any input (in-place merge). Host memory.
 */
RINGATTN_API ringattn_status_t ringattn_merge_partials(int num_partials, int64_t num_tokens,
                                                       int num_heads, int head_dim_v,
                                                       ringattn_dtype_t dtype,
                                                       const ringattn_tensor_t *parts_o,
                                                       const float *const *parts_lse,
                                                       ringattn_tensor_t out_o, float *out_lse);

#ifdef __cplusplus
}
#endif

#endif /* RINGATTN_H */
