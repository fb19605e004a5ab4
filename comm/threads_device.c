/*
 * The threads transport on device memory (DESIGN: the ring on CUDA): ranks as threads of one
 * process, each with its compute stream (the plan's: the caller's) and a comm stream of its own
 * on one device. A message is a device-to-device copy on the sender's comm stream, queued when the
 * receiver matches it, after two events: the sender's `ready` (recorded on its compute stream
 * at the exchange's start: the data is written) and the receiver's (its receive buffer is no
 * longer read). The copy records `sent` and `received`; at the exchange's wait each compute
 * stream waits on its own. No host thread waits for the device: the host matches messages and
 * the device runs the copies in stream order, overlapped with the step's kernels. Every event
 * and stream is made at comm creation, so an exchange allocates nothing (threads_hub.h).
 */
#include "base/error.h"
#include "base/call_stream.h"
#include "comm/threads_hub.h"

static ringattn_status_t make_rank(const ra_memory_ops *d, dev_rank *r)
{
    RA_TRY(d->stream_create(&r->stream));
    RA_TRY(d->event_create(&r->ready));
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) {
        RA_TRY(d->event_create(&r->sent[i]));
        RA_TRY(d->event_create(&r->received[i]));
    }
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__threads_device_make(hub *h)
{
    const int previous = h->dev->set_device(h->device);
    RA_CHECK(previous >= 0, RINGATTN_ERR_CUDA,
             "ringattn_comm_create_threads_device: device %d: %s cannot make it current",
             h->device, h->dev->name);
    if (h->device < 0) h->device = previous;
    ringattn_status_t st = RINGATTN_SUCCESS;
    for (int r = 0; r < h->size && st == RINGATTN_SUCCESS; ++r) st = make_rank(h->dev, &h->ranks[r]);
    h->dev->set_device(previous);
    return st;
}

void ra__threads_device_free(hub *h, int rank)
{
    dev_rank *r = &h->ranks[rank];
    const int previous = h->dev->set_device(h->device);
    /* queued copies still run: a stream's destruction waits for them, as its events' do */
    if (r->stream) h->dev->stream_destroy(r->stream);
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) {
        if (r->sent[i]) h->dev->event_destroy(r->sent[i]);
        if (r->received[i]) h->dev->event_destroy(r->received[i]);
    }
    if (r->ready) h->dev->event_destroy(r->ready);
    *r = (dev_rank){0};
    if (previous >= 0) h->dev->set_device(previous);
}

ringattn_status_t ra__threads_device_start(hub *h, int rank, ra_exchange *x, void *compute)
{
    dev_rank *me = &h->ranks[rank];
    /* a second exchange in flight would record `ready` again under the first one's waits */
    RA_CHECK(!me->busy, RINGATTN_ERR_INTERNAL,
             "ringattn comm threads: rank %d: an exchange started while another is in flight "
             "(a device comm has one at a time)",
             rank);
    exchange_state *s = state_of(x);
    s->compute = ra__call_stream_device(compute);
    s->sends = s->receives = 0;
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) {
        if (x->send[i].bytes) s->sends |= 1u << i;
        if (x->recv[i].bytes) s->receives |= 1u << i;
    }
    RA_TRY(h->dev->event_record(me->ready, s->compute));
    me->busy = 1;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__threads_device_copy(hub *h, int to, int slot, const post *p, const ra_msg *r)
{
    const ra_memory_ops *d = h->dev;
    const dev_rank *from = &h->ranks[p->src], *dst = &h->ranks[to];
    RA_TRY(d->stream_wait(from->stream, p->ready));
    RA_TRY(d->stream_wait(from->stream, dst->ready));
    RA_TRY(d->copy_async(r->buf, p->buf, p->bytes, from->stream));
    RA_TRY(d->event_record(from->sent[slot], from->stream));
    return d->event_record(dst->received[slot], from->stream);
}

ringattn_status_t ra__threads_device_finish(hub *h, int rank, ra_exchange *x)
{
    const exchange_state *s = state_of(x);
    const dev_rank *me = &h->ranks[rank];
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) {
        if (s->sends & (1u << i)) RA_TRY(h->dev->stream_wait(s->compute, me->sent[i]));
        if (s->receives & (1u << i)) RA_TRY(h->dev->stream_wait(s->compute, me->received[i]));
    }
    return RINGATTN_SUCCESS;
}
