/*
 * The MPI transport's data plane. Each message goes as pieces of impl->chunk bytes, a few in
 * flight at once, all under the message's tag (MPI matches same-tag messages in order): a
 * piece that completes is progress, so that the deadline can mean "no progress for
 * RINGATTN_COMM_TIMEOUT seconds" (comm.h) -- a large shard over a slow but live link is not an
 * error, a dead peer still is. Every received piece is checked for its exact size.
 *
 * A rank may wait on a peer that is itself waiting, on a slow link further round the ring, or
 * computing a long step: nothing moves between the two, yet the ring is alive. So heartbeats:
 * a computing rank sends every peer one every quarter deadline (mpi.c's beat, from the
 * kernels' polls), and a waiting rank sends the ranks it sends to one with the age of its own
 * latest progress (a heartbeat it heard counts, at the age it carried). A heartbeat from a
 * rank the exchange waits for is progress at that age. Ages only grow along a chain, so ranks
 * that wait on each other in a cycle still time out, and a dead or stalled rank is found
 * within about a deadline; the failure notice reaches the rest (comm.h).
 */
#include <string.h>

#include "base/error.h"
#include "base/call_stream.h"
#include "comm/mpi_impl.h"

enum { WINDOW = 4, CHANNELS = 2 * RA_EXCHANGE_SLOTS }; /* channels: sends, then receives */

typedef struct channel {
    MPI_Request req[WINDOW];
    int count[WINDOW]; /* bytes of the piece each request moves */
    size_t posted;     /* bytes of the message posted so far */
} channel;

typedef struct exchange_state {
    channel ch[CHANNELS];
} exchange_state;

_Static_assert(sizeof(exchange_state) <= RA_EXCHANGE_IMPL_BYTES,
               "an exchange's MPI state fits its impl bytes");
static exchange_state *state_of(ra_exchange *x) { return (exchange_state *)(void *)x->impl; }

static ra_msg *msg_of(ra_exchange *x, int i)
{
    return i < RA_EXCHANGE_SLOTS ? &x->send[i] : &x->recv[i - RA_EXCHANGE_SLOTS];
}

/* Posts the message's next pieces into the channel's free requests. */
static ringattn_status_t post(ringattn_comm_t c, ra_exchange *x, int i)
{
    const mpi_impl *impl = c->impl;
    channel *ch = &state_of(x)->ch[i];
    const ra_msg *m = msg_of(x, i);
    const int tag = x->tag + i % RA_EXCHANGE_SLOTS;
    for (int w = 0; w < WINDOW && ch->posted < m->bytes; ++w) {
        if (ch->req[w] != MPI_REQUEST_NULL) continue;
        const size_t left = m->bytes - ch->posted;
        const int n = (int)(left < impl->chunk ? left : impl->chunk);
        char *at = (char *)m->buf + ch->posted;
        const int rc = i < RA_EXCHANGE_SLOTS
                           ? MPI_Isend(at, n, MPI_BYTE, m->peer, tag, impl->comm, &ch->req[w])
                           : MPI_Irecv(at, n, MPI_BYTE, m->peer, tag, impl->comm, &ch->req[w]);
        if (rc != MPI_SUCCESS) return ra__mpi_error(c, "MPI_Isend/MPI_Irecv", rc);
        ch->count[w] = n;
        ch->posted += (size_t)n;
    }
    return RINGATTN_SUCCESS;
}

/* Tests every piece in flight and posts the next ones; *moved when a piece completed. */
static ringattn_status_t advance(ringattn_comm_t c, ra_exchange *x, int *done, int *moved)
{
    *done = 1;
    for (int i = 0; i < CHANNELS; ++i) {
        channel *ch = &state_of(x)->ch[i];
        const ra_msg *m = msg_of(x, i);
        for (int w = 0; w < WINDOW; ++w) {
            if (ch->req[w] == MPI_REQUEST_NULL) continue;
            int flag = 0, got = 0;
            MPI_Status status;
            int rc = MPI_Test(&ch->req[w], &flag, &status);
            if (rc == MPI_SUCCESS && flag && i >= RA_EXCHANGE_SLOTS)
                rc = MPI_Get_count(&status, MPI_BYTE, &got);
            if (rc != MPI_SUCCESS) return ra__mpi_error(c, "MPI_Test", rc);
            if (!flag) continue;
            RA_CHECK(i < RA_EXCHANGE_SLOTS || got == ch->count[w], RINGATTN_ERR_COMM,
                     "ringattn comm mpi: rank %d: a piece from rank %d: got %d bytes, expected "
                     "%d (RINGATTN_MPI_CHUNK differs between ranks?)",
                     c->rank, m->peer, got, ch->count[w]);
            *moved = 1;
        }
        RA_TRY(post(c, x, i));
        for (int w = 0; w < WINDOW; ++w) *done = *done && ch->req[w] == MPI_REQUEST_NULL;
        *done = *done && ch->posted == m->bytes;
    }
    return RINGATTN_SUCCESS;
}

/* Gives the exchange up: receives are cancelled; what still runs is kept (ra__mpi_orphan).
   Returns the first peer it was still waiting for. */
static int give_up(ringattn_comm_t c, ra_exchange *x)
{
    int peer = -1;
    for (int i = 0; i < CHANNELS; ++i) {
        channel *ch = &state_of(x)->ch[i];
        if (ch->posted < msg_of(x, i)->bytes && peer < 0) peer = msg_of(x, i)->peer;
        for (int w = 0; w < WINDOW; ++w) {
            if (ch->req[w] == MPI_REQUEST_NULL) continue;
            if (peer < 0) peer = msg_of(x, i)->peer;
            int flag = 0;
            MPI_Cancel(&ch->req[w]);
            MPI_Test(&ch->req[w], &flag, MPI_STATUS_IGNORE);
            if (!flag) ra__mpi_orphan(c, &ch->req[w]);
            ch->req[w] = MPI_REQUEST_NULL;
        }
        ch->posted = msg_of(x, i)->bytes;
    }
    return peer;
}

void ra__mpi_send_beat(ringattn_comm_t c, int peer, double age)
{
    mpi_impl *impl = c->impl;
    for (size_t i = 0; i < sizeof impl->beats / sizeof impl->beats[0]; ++i) {
        int free_slot = impl->beats[i].req == MPI_REQUEST_NULL;
        if (!free_slot) MPI_Test(&impl->beats[i].req, &free_slot, MPI_STATUS_IGNORE);
        if (!free_slot) continue;
        impl->beats[i].age = age;
        MPI_Isend(&impl->beats[i].age, 1, MPI_DOUBLE, peer, RA_COMM_TAG_ALIVE, impl->comm,
                  &impl->beats[i].req);
        return;
    }
}

void ra__mpi_heard(ringattn_comm_t c, int (*from)(const void *, int), const void *ctx,
                   double now, double *last)
{
    for (;;) {
        int flag = 0;
        double age;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, RA_COMM_TAG_ALIVE, ra__mpi_comm_of(c), &flag, &st) !=
                MPI_SUCCESS ||
            !flag)
            return;
        if (MPI_Recv(&age, 1, MPI_DOUBLE, st.MPI_SOURCE, RA_COMM_TAG_ALIVE, ra__mpi_comm_of(c),
                     MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return;
        if ((!from || from(ctx, st.MPI_SOURCE)) && age >= 0 && now - age > *last)
            *last = now - age;
    }
}

/* Does this exchange still wait for rank `peer`? */
static int waits_for(const void *ctx, int peer)
{
    const ra_exchange *x = ctx;
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i)
        if (x->recv[i].bytes && x->recv[i].peer == peer) return 1;
    return 0;
}

static void poll_exchange(void *ctx)
{
    ra_exchange *x = ctx;
    int done, moved;
    (void)advance(x->comm, x, &done, &moved); /* a failure shows again in the wait */
}

ringattn_status_t ra__mpi_exchange_start(ringattn_comm_t c, ra_exchange *x, void *stream)
{
    x->comm = c;
    x->tag = ra__comm_next_tag(c);
    x->stream = NULL;
    exchange_state *s = state_of(x);
    for (int i = 0; i < CHANNELS; ++i) {
        for (int w = 0; w < WINDOW; ++w) s->ch[i].req[w] = MPI_REQUEST_NULL;
        s->ch[i].posted = 0;
    }
    for (int i = 0; i < CHANNELS; ++i) {
        const ringattn_status_t st = post(c, x, i);
        if (st != RINGATTN_SUCCESS) {
            give_up(c, x);
            return st;
        }
    }
    if (stream && ra__call_stream_attach(stream, poll_exchange, x) == 0) x->stream = stream;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__mpi_exchange_test(ringattn_comm_t c, ra_exchange *x, int *done)
{
    int moved = 0;
    return advance(c, x, done, &moved);
}

ringattn_status_t ra__mpi_exchange_wait(ringattn_comm_t c, ra_exchange *x)
{
    if (x->stream) ra__call_stream_detach(x->stream, x);
    x->stream = NULL;
    const double limit = ra__comm_timeout_s();
    double last = ra__comm_now(), beat = last; /* the deadline counts time without progress */
    for (;;) {
        int done = 0, moved = 0;
        ringattn_status_t st = advance(c, x, &done, &moved);
        if (st == RINGATTN_SUCCESS && done) return st;
        if (st == RINGATTN_SUCCESS && ra__mpi_peer_failed(c))
            st = ra__fail(RINGATTN_ERR_COMM, "ringattn comm mpi: rank %d: %s", c->rank,
                          c->reason);
        const double now = ra__comm_now();
        if (moved) last = now;
        ra__mpi_heard(c, waits_for, x, now, &last);
        if (now - beat > limit / 4 && now - last < limit) {
            for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i)
                if (x->send[i].bytes) ra__mpi_send_beat(c, x->send[i].peer, now - last);
            ra__comm_beat_companion(c); /* a 2D plan's group waits on this ring too */
            beat = now;
        }
        if (st == RINGATTN_SUCCESS && now - last <= limit) continue;
        const int peer = give_up(c, x);
        return st != RINGATTN_SUCCESS
                   ? st
                   : ra__fail(RINGATTN_ERR_COMM,
                              "ringattn comm mpi: rank %d: no progress for %g s with rank %d",
                              c->rank, limit, peer);
    }
}
