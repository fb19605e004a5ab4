#include "ring/mailbox_transport.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <catch2/catch.hpp>

namespace mailbox {

struct Request {
    struct Recv {
        ringattn_transport_msg_t m;
        int tag;
        bool done;
    };
    std::vector<Recv> recvs;
};

namespace {

// Checks that every callback runs on the endpoint's thread, one at a time; a callback that
// does not (!ok) touches nothing and fails.
constexpr int MISPLACED = 93;
struct Guard {
    Endpoint &ep;
    bool ok = true;
    explicit Guard(Endpoint &e) : ep(e)
    {
        if (ep.inside.fetch_add(1) != 0) ++ep.overlapped, ok = false;
        if (!ep.any_thread && std::this_thread::get_id() != ep.owner) ++ep.wrong_thread, ok = false;
    }
    ~Guard() { --ep.inside; }
};

Endpoint &ep_of(void *user) { return *static_cast<Endpoint *>(user); }

double timeout_s()
{
    const char *env = std::getenv("RINGATTN_COMM_TIMEOUT");
    return env && std::atof(env) > 0 ? std::atof(env) : 60.0;
}

int sendrecv_start(void *user, const ringattn_transport_msg_t *sends, int num_sends,
                   const ringattn_transport_msg_t *recvs, int num_recvs, int tag, void **request)
{
    Endpoint &ep = ep_of(user);
    Guard g(ep);
    if (!g.ok) return MISPLACED;
    if (ep.inject("sendrecv_start")) return FAULT;
    // the header's promises: a message at least, tags in range, none empty, peers that exist
    const auto well_formed = [&](const ringattn_transport_msg_t *m, int n) {
        bool ok = n >= 0 && (n == 0 || tag + n - 1 <= 32767);
        for (int i = 0; ok && i < n; ++i) ok = m[i].bytes > 0 && m[i].peer >= 0 && m[i].peer < ep.mb->size;
        return ok;
    };
    if (tag < 0 || num_sends + num_recvs < 1 || !well_formed(sends, num_sends) ||
        !well_formed(recvs, num_recvs)) {
        ++ep.bad_message;
        return 90;
    }
    for (int i = 0; i < num_sends; ++i) ep.bytes_sent += sends[i].bytes;
    auto *r = new Request;
    for (int j = 0; j < num_recvs; ++j) r->recvs.push_back({recvs[j], tag + j, false});
    {
        std::lock_guard<std::mutex> lk(ep.mb->mu);
        for (int i = 0; i < num_sends; ++i) {
            const auto *p = static_cast<const unsigned char *>(sends[i].buf);
            ep.mb->posted.push_back({ep.rank, sends[i].peer, tag + i, {p, p + sends[i].bytes}});
        }
    }
    ep.mb->cv.notify_all();
    ep.live.insert(r);
    *request = r;
    return 0;
}

// alltoall_start: every pair's message on `tag` itself, entries indexed by rank.
int alltoall_start(void *user, const ringattn_transport_msg_t *sends,
                   const ringattn_transport_msg_t *recvs, int tag, void **request)
{
    Endpoint &ep = ep_of(user);
    Guard g(ep);
    if (!g.ok) return MISPLACED;
    if (ep.inject("alltoall_start")) return FAULT;
    const int P = ep.mb->size;
    bool ok = tag >= 0 && tag <= 32767;
    for (int q = 0; q < P; ++q) // the header's promises: peers by index, nothing to oneself
        ok = ok && sends[q].peer == q && recvs[q].peer == q &&
             (q != ep.rank || (sends[q].bytes == 0 && recvs[q].bytes == 0));
    if (!ok) {
        ++ep.bad_message;
        return 90;
    }
    ++ep.alltoalls;
    auto *r = new Request;
    {
        std::lock_guard<std::mutex> lk(ep.mb->mu);
        for (int q = 0; q < P; ++q) {
            if (recvs[q].bytes) r->recvs.push_back({recvs[q], tag, false});
            if (!sends[q].bytes) continue;
            const auto *p = static_cast<const unsigned char *>(sends[q].buf);
            ep.mb->posted.push_back({ep.rank, q, tag, {p, p + sends[q].bytes}});
            ep.bytes_sent += sends[q].bytes;
        }
    }
    ep.mb->cv.notify_all();
    ep.live.insert(r);
    *request = r;
    return 0;
}

// Lock held: takes the messages r waits for; 1 when all arrived, -1 on a size mismatch.
int match(Endpoint &ep, Request *r)
{
    int all = 1;
    for (Request::Recv &v : r->recvs) {
        if (v.done) continue;
        if (ep.deliver_late) {
            std::memset(v.m.buf, 0x5a, v.m.bytes); // a buffer freed early: ASan sees it
            v.done = true;
            ++ep.late_writes;
            continue;
        }
        auto &q = ep.mb->posted;
        for (auto it = q.begin(); it != q.end(); ++it) {
            if (it->src != v.m.peer || it->dst != ep.rank || it->tag != v.tag) continue;
            if (it->data.size() != v.m.bytes) return -1;
            std::memcpy(v.m.buf, it->data.data(), v.m.bytes);
            q.erase(it);
            v.done = true;
            break;
        }
        all = all && v.done;
    }
    return all;
}

// test (timeout 0) and wait: the messages that arrived taken, until all did or time is up.
int settle(void *user, void *request, double timeout, int *done, const char *callback)
{
    Endpoint &ep = ep_of(user);
    Guard g(ep);
    if (!g.ok) return MISPLACED;
    auto *r = static_cast<Request *>(request);
    if (!ep.live.count(r)) return ++ep.stale, 92;
    if (ep.inject(callback)) return FAULT;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    std::unique_lock<std::mutex> lk(ep.mb->mu);
    int m = match(ep, r);
    while (m == 0 && timeout > 0 && ep.mb->cv.wait_until(lk, until) != std::cv_status::timeout)
        m = match(ep, r);
    if (m == 0 && timeout > 0) m = match(ep, r);
    *done = m == 1;
    if (m == -1) return 91;
    if (*done) {
        ep.live.erase(r);
        delete r;
    }
    return 0;
}

int test(void *user, void *request, int *done) { return settle(user, request, 0, done, "test"); }

int wait(void *user, void *request, double timeout, int *done)
{
    return settle(user, request, timeout, done, "wait");
}

// A barrier: the last rank in publishes the result; a rank not joined in time is an error.
int allreduce(void *user, int64_t *vals, int n, ringattn_reduce_op_t op)
{
    Endpoint &ep = ep_of(user);
    Guard g(ep);
    if (!g.ok) return MISPLACED;
    if (ep.inject("allreduce")) return FAULT;
    Mailbox &mb = *ep.mb;
    std::unique_lock<std::mutex> lk(mb.mu);
    for (int i = 0; i < n; ++i) {
        int64_t &a = mb.acc[i];
        const int64_t v = vals[i];
        a = mb.arrived == 0 ? v
            : op == RINGATTN_REDUCE_SUM ? a + v
            : op == RINGATTN_REDUCE_MIN ? std::min(a, v)
                                        : std::max(a, v);
    }
    const unsigned long gen = mb.generation;
    if (++mb.arrived == mb.size) {
        std::memcpy(mb.result, mb.acc, sizeof mb.acc);
        mb.arrived = 0;
        ++mb.generation;
        mb.cv.notify_all();
    } else if (!mb.cv.wait_for(lk, std::chrono::duration<double>(timeout_s()),
                               [&] { return mb.generation != gen; })) {
        return 8;
    }
    std::memcpy(vals, mb.result, (size_t)n * sizeof *vals);
    return 0;
}

void release(void *user)
{
    Endpoint &ep = ep_of(user);
    Guard g(ep);
    if (!g.ok) return;
    ++ep.releases;
    ep.live_at_release = (int)ep.live.size();
    // the header lets a request still live here write its buffers (the library must not have
    // freed them): do so, for ASan to see
    for (Request *r : ep.live) {
        for (Request::Recv &v : r->recvs)
            if (!v.done) std::memset(v.m.buf, 0x5a, v.m.bytes);
        delete r;
    }
    ep.live.clear();
}

} // namespace

ringattn_transport_t table(Endpoint *ep)
{
    ringattn_transport_t t = RINGATTN_TRANSPORT_INIT;
    t.user = ep;
    t.sendrecv_start = sendrecv_start;
    t.test = test;
    t.wait = wait;
    t.allreduce = allreduce;
    t.release = release;
    if (ep->with_alltoall) t.alltoall_start = alltoall_start;
    return t;
}


ringattn_status_t Network::make(int rank, int ranks, ringattn_comm_t *comm)
{
    Endpoint *ep;
    {
        std::lock_guard<std::mutex> lk(mu);
        if (!mb || made_in_run == mb->size) { // the first rank of a run
            mb = std::make_shared<Mailbox>();
            mb->size = ranks;
            made_in_run = 0;
        }
        ++made_in_run;
        endpoints.emplace_back(new Endpoint);
        ep = endpoints.back().get();
        ep->mb = mb;
        ep->rank = rank;
        ep->any_thread = any_thread;
        ep->with_alltoall = with_alltoall;
    }
    ep->owner = std::this_thread::get_id();
    if (rank == fault_rank) ep->fail = fail, ep->fail_at = fail_at;
    const ringattn_transport_t t = table(ep);
    return ringattn_comm_create_custom(&t, rank, ranks, comm);
}

Endpoint &Network::of(int r)
{
    for (auto &ep : endpoints)
        if (ep->rank == r) return *ep;
    FAIL("no endpoint of rank " << r);
    return *endpoints.front();
}

ringtest::RunOptions Network::options()
{
    ringtest::RunOptions opt;
    opt.make_comm = [this](int r, int n, ringattn_comm_t *c) { return make(r, n, c); };
    return opt;
}

} // namespace mailbox
