/*
 * ringattn over a transport of the caller's: a table of callbacks that carries the ring's bytes
 * (torch.distributed/gloo from Python, a framework's own messaging), for ranks that are
 * processes, threads or hosts. No MPI, NCCL or CUDA type appears here, so a binding through a
 * foreign-function interface (Python's ctypes) needs only this header's layout.
 *
 * What the library asks of the transport:
 * - Messages: sendrecv_start posts a batch of point-to-point messages of host memory; test and
 *   wait say when all of a batch have completed. A message is matched by (source, destination,
 *   tag), where the tag is `tag` plus the message's index within sends (resp. recvs); the same
 *   triple is matched in the order it was posted (as MPI's and gloo's are). Sizes always agree:
 *   the receiver posts exactly the bytes the sender sends. Every message has bytes > 0, and the
 *   library keeps every tag + index within 0 .. 32767 (the least tag bound MPI allows). Today it
 *   posts one send and one receive at most per batch, every message at index 0 (an exchange's
 *   slot i is a batch of its own on the exchange's tag + i, so that sender and receiver name
 *   the same tag whichever slots are empty), but a transport must honour the index. A 2D
   plan's all-to-all (ringattn_plan_create_2d over two comms of this transport: it cannot be
   split by the library) is one alltoall_start where the transport has it (since 0.6), else
   P - 1 rounds of such batches, in round k a send to rank + k and a receive from rank - k.
 * - allreduce: the agreements that open and close every collective call (a few int64 values).
 *   It is the only callback without a time limit from the library (the call blocks): bound it
 *   yourself, returning nonzero after about RINGATTN_COMM_TIMEOUT seconds, or a failure on one
 *   rank can leave the others blocked in it (below).
 * - The ranks are 0 .. size - 1 of ringattn_comm_create_custom; every rank creates its comm with
 *   the same size and makes the same collective calls (include/ringattn.h).
 *
 * Threads: every callback is called on the thread that called the ringattn function in progress
 * (ringattn_plan_create, ringattn_forward, ringattn_backward, ringattn_plan_destroy,
 * ringattn_comm_destroy) -- the CPU kernels' OpenMP workers never call it: the kernels test
 * the exchanges in flight only from their team's thread 0, which OpenMP makes the calling
 * thread (kernels/cpu/forward.c, backward.c). Nothing is called from a thread of the
 * library's own, so a Python callback runs on the thread that made the call (ctypes takes the
 * GIL back for it). A comm and its plans are used by one thread at a time (their calls are
 * collective and numbered, as on every comm), so the callbacks of one comm never run
 * concurrently; those of different comms may (ranks as threads of one process).
 *
 * Failures. Any nonzero return from a callback is RINGATTN_ERR_COMM for the call, with a message
 * naming the callback, the rank and the code, and fails the comm for good: every later call on
 * it or its plans fails at once (include/ringattn.h, failure semantics). The transport has no
 * way to tell the peers, so they find out through their own deadline: every wait for messages
 * gives up after RINGATTN_COMM_TIMEOUT seconds (default 60) from its start, naming the peer and
 * the ring step. There are no heartbeats: the timeout must exceed the longest a rank may wait
 * for a peer still computing its step plus a shard's transfer. A rank whose comm failed skips the
 * closing agreement, so a peer already in it waits there for the transport's own allreduce
 * timeout. A request the library gave up (at its deadline, or after an error of test or wait
 * that left *done = 0) is not forgotten: the library keeps testing it (at ringattn_plan_destroy
 * and ringattn_comm_destroy) until it reports *done = 1, and never frees the buffers under it --
 * a plan whose buffers a live request may still use leaves them allocated (logged).
 */
#ifndef RINGATTN_TRANSPORT_H
#define RINGATTN_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "ringattn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ringattn_reduce_op {
    RINGATTN_REDUCE_MIN = 0,
    RINGATTN_REDUCE_MAX = 1,
    RINGATTN_REDUCE_SUM = 2
} ringattn_reduce_op_t;

/* One message: bytes of host memory at buf, to (a send) or from (a receive) rank `peer`. */
typedef struct ringattn_transport_msg {
    void *buf;
    size_t bytes;
    int peer;
} ringattn_transport_msg_t;

/* Callbacks return 0, or a nonzero error code of the transport's (it is in the message). */
typedef struct ringattn_transport {
    size_t struct_size; /* sizeof(ringattn_transport_t) */
    void *user;         /* passed to every callback */
    /* Post one batch of point-to-point messages: sends[i] goes to sends[i].peer, recvs[j]
       comes from recvs[j].peer; a message is matched by (source, destination, tag) where the
       tag is `tag` + its index within sends (resp. recvs), 0 <= tag+index <= 32767. Buffers
       stay valid until the request completes (send buffers are never written). The arrays
       themselves are valid during the call only, and may be NULL when their count is 0; a batch
       has at least one message. Returns 0 or a nonzero error code; *request is an opaque
       handle the transport owns. After a nonzero return no request exists. Must not block on
       the peers (they post their side later). */
    int (*sendrecv_start)(void *user, const ringattn_transport_msg_t *sends, int num_sends,
                          const ringattn_transport_msg_t *recvs, int num_recvs, int tag,
                          void **request);
    /* Non-blocking: *done = 1 once every message of the request completed; after that the
       request is the transport's to release, the library never passes it again. *done is read
       whatever the return code: a request whose transfers have all stopped after an error (a
       cancelled one) may say *done = 1 with its code; *done = 0 with a nonzero code leaves it
       live, and the library gives it up (it tests it again later, see Failures). The CPU
       kernels call it between their tiles while a ring step computes: keep it cheap. */
    int (*test)(void *user, void *request, int *done);
    /* Blocks up to timeout_s seconds; *done as for test. Running out of time is not an error:
       return 0 with *done = 0. The library calls it in short slices, round robin over the
       requests it waits for, so a transport that only progresses a request while it is tested
       or waited for still moves them all. */
    int (*wait)(void *user, void *request, double timeout_s, int *done);
    /* Blocking, in place, over n <= 64 int64 values, collective over all ranks. */
    int (*allreduce)(void *user, int64_t *vals, int n, ringattn_reduce_op_t op);
    /* Optional (may be NULL): called once when the comm is destroyed, after every other
       callback. Requests the library gave up that never reported *done = 1 are still live
       then: ending them is the transport's (the library has not freed their buffers). */
    void (*release)(void *user);
    /* since 0.6, optional (NULL: the library runs an all-to-all as size - 1 rounds of
       sendrecv_start). A 2D plan's all-to-all (ringattn_plan_create_2d) as one request:
       sends[r] goes to rank r and recvs[r] comes from rank r, for every r of 0 .. size - 1 (so
       sends[r].peer = recvs[r].peer = r; bytes 0: nothing between the pair, always so for this
       rank's own entries), each pair's message on `tag` itself (0 <= tag <= 32767). Sizes agree
       as for sendrecv_start; test and wait complete the request as theirs, and it is given up
       the same way. A transport with a collective of its own (MPI_Ialltoallv,
       torch.distributed's all_to_all) moves it in one call instead of size - 1 rounds. */
    int (*alltoall_start)(void *user, const ringattn_transport_msg_t *sends,
                          const ringattn_transport_msg_t *recvs, int tag, void **request);
} ringattn_transport_t;

#define RINGATTN_TRANSPORT_INIT \
    {sizeof(ringattn_transport_t), NULL, NULL, NULL, NULL, NULL, NULL, NULL}

/*
 * Makes this rank's comm over `transport` (copied: the caller's struct may go; `user` must live
 * until the comm is destroyed). Not collective: no callback is called here. The comm moves host
 * memory: plans on it run on the CPU backend (a CUDA plan is RINGATTN_ERR_UNSUPPORTED at plan
 * creation). RINGATTN_ERR_INVALID_ARGUMENT, nothing written, for a NULL transport or comm, a
 * struct_size that is no released size of ringattn_transport_t, a NULL required callback,
 * size < 1 or rank outside 0 .. size - 1. Destroy with ringattn_comm_destroy (which calls
 * release).
 */
RINGATTN_API ringattn_status_t ringattn_comm_create_custom(const ringattn_transport_t *transport,
                                                           int rank, int size,
                                                           ringattn_comm_t *comm);

#ifdef __cplusplus
}
#endif

#endif
