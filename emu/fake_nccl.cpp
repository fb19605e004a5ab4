// The fake NCCL (emu/nccl/nccl.h) over the fake runtime's deferred streams:
// communicators by rendezvous on a unique id (ranks as threads) or split off one, point-to-point
// messages matched in order per (sender, receiver) and copied in both streams' order, group
// calls, all-reduce, non-blocking initialisation, asynchronous errors and abort. Every operation
// is a gated stream operation (fake_runtime.h: enqueue_gated): it runs when what it waits for has
// run on the other rank's stream, so a drain waits for other ranks as a GPU would, and a message
// nobody sends blocks its stream until the communicator is aborted. An aborted rank's queued
// operations run as no-ops: they contribute and deliver nothing. Its peers hear nothing of it, as
// within one node (ranks as threads on one device are); with ra_emu_nccl_remote_errors(1) their
// ncclCommGetAsyncError reports ncclRemoteError from then on, as NCCL's network transports
// report a peer whose connections closed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "emu/cuda_emu.h"
#include "emu/nccl/nccl.h"

namespace {

std::mutex nmu; // the fake NCCL's host state (lock order: the runtime's lock, then this one)
std::condition_variable ncv;

// One message of a (sender, receiver) pair: the k-th send meets the k-th receive.
struct Msg {
    const void *src = nullptr;
    size_t bytes = 0;
    bool sent = false;   // the sender's stream reached the send
    bool copied = false; // the receiver's stream copied it
};

// One all-reduce of a clique, its k-th: every rank's contribution, then every rank's result.
struct Coll {
    std::vector<std::vector<unsigned char>> parts;
    int arrived = 0, consumed = 0;
};

// A (sender, receiver) pair's messages in posting order: those one side has posted and the
// other not yet (both sides' stream operations hold the others).
struct PairLog {
    std::deque<std::shared_ptr<Msg>> pending;
    size_t first = 0;            // the posting index of pending.front()
    size_t sends = 0, recvs = 0; // posted so far
};

// A clique's k-th split: each rank's (color, key), how many came and left, its name's number.
struct Split {
    std::vector<std::pair<int, int>> by_rank;
    int arrived = 0, left = 0;
    unsigned long id = 0;
};

struct Clique {
    int nranks = 0, joined = 0;
    bool broken = false; // a rank aborted: the others see ncclRemoteError
    std::map<std::pair<int, int>, PairLog> pairs;
    std::map<unsigned long, std::shared_ptr<Coll>> colls;
    std::map<unsigned long, std::shared_ptr<Split>> splits;
};

std::map<std::string, std::shared_ptr<Clique>> cliques; // by unique id or split
unsigned long next_split = 0;

struct State {
    std::shared_ptr<Clique> clique;
    int rank = 0, device = 0;
    std::atomic<bool> aborted{false};
    unsigned long colls = 0; // all-reduces this rank has posted
    unsigned long sends = 0; // sends this rank has posted
    unsigned long splits = 0; // splits this rank has entered
};

// ra_emu_nccl_withhold_sends: this rank of every communicator posts its first `after` sends,
// then none (a peer that stops sending: its receivers wait until the communicator is aborted).
std::atomic<int> withhold_rank{-1};
std::atomic<unsigned long> withhold_after{0};
std::atomic<bool> remote_errors{false}; // ra_emu_nccl_remote_errors

// A point-to-point operation or an all-reduce, held until its group ends.
struct Pending {
    enum Kind { send, recv, allreduce } kind;
    std::shared_ptr<State> st;
    void *buf;
    const void *in;
    size_t count, elem;
    ncclDataType_t type;
    ncclRedOp_t op;
    int peer;
    cudaStream_t stream;
};

thread_local int group_depth = 0;
thread_local std::vector<Pending> group;
thread_local std::string last_error;

ncclResult_t fail(ncclResult_t r, const std::string &msg)
{
    last_error = "fake NCCL: " + msg;
    return r;
}

size_t elem_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

std::shared_ptr<Msg> message(Clique &c, int from, int to, bool is_send)
{
    PairLog &log = c.pairs[{from, to}];
    const size_t k = is_send ? log.sends++ : log.recvs++;
    while (log.first + log.pending.size() <= k) log.pending.push_back(std::make_shared<Msg>());
    std::shared_ptr<Msg> m = log.pending[k - log.first];
    while (!log.pending.empty() && log.first < std::min(log.sends, log.recvs))
        log.pending.pop_front(), ++log.first;
    return m;
}

template <class T> void reduce(T *acc, const T *x, size_t n, ncclRedOp_t op)
{
    for (size_t i = 0; i < n; ++i)
        acc[i] = op == ncclSum ? acc[i] + x[i] : op == ncclProd ? acc[i] * x[i]
               : op == ncclMax ? (x[i] > acc[i] ? x[i] : acc[i]) : (x[i] < acc[i] ? x[i] : acc[i]);
}

void reduce_into(void *out, const std::vector<std::vector<unsigned char>> &parts, size_t count,
                 ncclDataType_t t, ncclRedOp_t op)
{
    std::memcpy(out, parts[0].data(), parts[0].size());
    for (size_t r = 1; r < parts.size(); ++r) {
        const void *x = parts[r].data();
        switch (t) {
        case ncclInt32: reduce((int32_t *)out, (const int32_t *)x, count, op); break;
        case ncclUint32: reduce((uint32_t *)out, (const uint32_t *)x, count, op); break;
        case ncclInt64: reduce((int64_t *)out, (const int64_t *)x, count, op); break;
        case ncclUint64: reduce((uint64_t *)out, (const uint64_t *)x, count, op); break;
        case ncclFloat32: reduce((float *)out, (const float *)x, count, op); break;
        case ncclFloat64: reduce((double *)out, (const double *)x, count, op); break;
        default: reduce((uint8_t *)out, (const uint8_t *)x, count, op); break;
        }
    }
}

// The group's operations onto their streams: every send first (the data is ready), then the
// receives and all-reduces, then every send's completion (its buffer may be reused), so that a
// ring of ranks that each send and receive in one group never waits on itself.
void emit(std::vector<Pending> &ops)
{
    struct Sent {
        cudaStream_t stream;
        std::shared_ptr<Msg> m;
        std::shared_ptr<State> st;
    };
    std::vector<Sent> sent;
    for (const Pending &p : ops) {
        if (p.kind != Pending::send) continue;
        if (p.st->rank == withhold_rank.load() && p.st->sends++ >= withhold_after.load()) continue;
        std::shared_ptr<Msg> m;
        {
            std::lock_guard<std::mutex> lk(nmu);
            m = message(*p.st->clique, p.st->rank, p.peer, true);
        }
        const void *src = p.in;
        const size_t bytes = p.count * p.elem;
        const auto st = p.st;
        ra_emu::enqueue_gated(p.stream, [] { return true; }, [m, st, src, bytes] {
            std::lock_guard<std::mutex> lk(nmu);
            if (!st->aborted.load()) m->src = src, m->bytes = bytes, m->sent = true;
        });
        sent.push_back({p.stream, m, p.st});
    }
    for (const Pending &p : ops) {
        if (p.kind == Pending::recv) {
            std::shared_ptr<Msg> m;
            {
                std::lock_guard<std::mutex> lk(nmu);
                m = message(*p.st->clique, p.peer, p.st->rank, false);
            }
            const auto st = p.st;
            void *dst = p.buf;
            const size_t bytes = p.count * p.elem;
            ra_emu::enqueue_gated(p.stream, [m, st] {
                std::lock_guard<std::mutex> lk(nmu);
                return m->sent || st->aborted.load();
            }, [m, st, dst, bytes] {
                std::lock_guard<std::mutex> lk(nmu);
                if (!st->aborted.load() && m->bytes == bytes) std::memcpy(dst, m->src, bytes);
                m->copied = true;
            });
        } else if (p.kind == Pending::allreduce) {
            std::shared_ptr<Coll> c;
            {
                std::lock_guard<std::mutex> lk(nmu);
                auto &slot = p.st->clique->colls[p.st->colls++];
                if (!slot) slot = std::make_shared<Coll>(), slot->parts.resize((size_t)p.st->clique->nranks);
                c = slot;
            }
            const auto st = p.st;
            const Pending q = p;
            ra_emu::enqueue_gated(p.stream, [] { return true; }, [c, st, q] {
                std::lock_guard<std::mutex> lk(nmu);
                if (st->aborted.load()) return;
                const auto *in = static_cast<const unsigned char *>(q.in);
                c->parts[(size_t)st->rank].assign(in, in + q.count * q.elem);
                ++c->arrived;
            });
            const unsigned long k = p.st->colls - 1;
            ra_emu::enqueue_gated(p.stream, [c, st] {
                std::lock_guard<std::mutex> lk(nmu);
                return c->arrived == (int)c->parts.size() || st->aborted.load();
            }, [c, st, q, k] {
                std::lock_guard<std::mutex> lk(nmu);
                if (!st->aborted.load()) reduce_into(q.buf, c->parts, q.count, q.type, q.op);
                if (++c->consumed == (int)c->parts.size()) st->clique->colls.erase(k);
            });
        }
    }
    for (const Sent &s : sent) {
        const auto m = s.m;
        const auto st = s.st;
        ra_emu::enqueue_gated(s.stream, [m, st] {
            std::lock_guard<std::mutex> lk(nmu);
            return m->copied || st->aborted.load();
        }, [] {});
    }
    ops.clear();
}

ncclResult_t post(Pending p)
{
    if (!p.st) return fail(ncclInvalidArgument, "NULL communicator");
    if (p.st->aborted.load()) return fail(ncclInvalidUsage, "communicator aborted");
    if (p.kind != Pending::allreduce && (p.peer < 0 || p.peer >= p.st->clique->nranks))
        return fail(ncclInvalidArgument, "peer " + std::to_string(p.peer) + " out of range");
    group.push_back(p);
    if (group_depth == 0) emit(group);
    return ncclSuccess;
}

} // namespace

struct ra_fake_nccl_comm {
    std::shared_ptr<State> st;
    bool blocking = true;
};

// Rank `rank` joins the clique `key` (made by its first rank), lock held: a blocking one waits
// for every rank, a non-blocking one returns ncclInProgress (ncclCommGetAsyncError says when).
static ncclResult_t join(std::unique_lock<std::mutex> &lk, const std::string &key, int nranks,
                         int rank, int device, bool blocking, ncclComm_t *comm)
{
    auto &cl = cliques[key];
    if (!cl) cl = std::make_shared<Clique>(), cl->nranks = nranks;
    if (cl->nranks != nranks) return fail(ncclInvalidUsage, "ranks disagree on nranks");
    auto *c = new ra_fake_nccl_comm;
    c->st = std::make_shared<State>();
    c->st->rank = rank, c->st->device = device, c->st->clique = cl;
    c->blocking = blocking;
    ++cl->joined;
    ncv.notify_all();
    *comm = c;
    if (!blocking) return ncclInProgress;
    const bool all = ncv.wait_for(lk, std::chrono::seconds(120), [&] { return cl->joined == cl->nranks; });
    return all ? ncclSuccess : fail(ncclSystemError, "rendezvous timed out");
}

extern "C" {

// A test hook (found by name, as the tests' others): rank -1 withholds nothing.
__attribute__((visibility("default"))) void ra_emu_nccl_withhold_sends(int rank,
                                                                       unsigned long after)
{
    withhold_after.store(after);
    withhold_rank.store(rank);
}

// A test hook: 1, an aborted rank's peers see ncclRemoteError (NCCL's network transports); 0,
// the default, they see nothing (within one node).
__attribute__((visibility("default"))) void ra_emu_nccl_remote_errors(int on)
{
    remote_errors.store(on != 0);
}

ncclResult_t ncclGetVersion(int *version) { return *version = NCCL_VERSION_CODE, ncclSuccess; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static std::atomic<unsigned long> next{1};
    std::memset(id->internal, 0, sizeof id->internal);
    std::snprintf(id->internal, sizeof id->internal, "fake-nccl-%lu", next++);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "bad communicator arguments");
    int device = 0;
    cudaGetDevice(&device); // before nmu: the runtime's lock comes first
    std::unique_lock<std::mutex> lk(nmu);
    return join(lk, std::string(id.internal, strnlen(id.internal, sizeof id.internal)), nranks, rank,
                device, !(config && config->blocking == 0), comm);
}

// Every rank of comm's clique enters its k-th split; once all have, each joins the clique of its
// color (named by the split), ranked by (key, rank), on comm's device.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    if (!comm || !newcomm || comm->st->aborted.load())
        return fail(ncclInvalidUsage, "no communicator, or an aborted one");
    std::unique_lock<std::mutex> lk(nmu);
    const std::shared_ptr<State> st = comm->st;
    const std::shared_ptr<Clique> cl = st->clique;
    const unsigned long k = st->splits++;
    auto &slot = cl->splits[k];
    if (!slot)
        slot = std::make_shared<Split>(), slot->id = next_split++, slot->by_rank.resize((size_t)cl->nranks);
    const std::shared_ptr<Split> sp = slot;
    sp->by_rank[(size_t)st->rank] = {color, key};
    ++sp->arrived;
    ncv.notify_all();
    if (!ncv.wait_for(lk, std::chrono::seconds(120), [&] { return sp->arrived == cl->nranks; }))
        return fail(ncclSystemError, "split rendezvous timed out");
    if (++sp->left == cl->nranks) cl->splits.erase(k);
    *newcomm = NCCL_COMM_NULL;
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    int nranks = 0, rank = 0;
    for (int r = 0; r < cl->nranks; ++r) {
        const auto &o = sp->by_rank[(size_t)r];
        nranks += o.first == color;
        rank += o.first == color && std::make_pair(o.second, r) < std::make_pair(key, st->rank);
    }
    return join(lk, "split-" + std::to_string(sp->id) + "-" + std::to_string(color), nranks, rank,
                st->device, config ? config->blocking != 0 : comm->blocking, newcomm);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    if (!comm || !err) return fail(ncclInvalidArgument, "NULL argument");
    std::lock_guard<std::mutex> lk(nmu);
    const Clique &cl = *comm->st->clique;
    *err = comm->st->aborted.load() || (cl.broken && remote_errors.load()) ? ncclRemoteError
           : cl.joined < cl.nranks                ? ncclInProgress
                                                  : ncclSuccess;
    return ncclSuccess;
}

// Queued operations of an aborted communicator still run, as no-ops: nothing waits on it, and
// its peers hear of it (ncclCommGetAsyncError).
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    {
        std::lock_guard<std::mutex> lk(nmu);
        comm->st->aborted.store(true);
        comm->st->clique->broken = true;
    }
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    delete comm; // queued operations keep its state alive
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    return *count = comm->st->clique->nranks, ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) { return *device = comm->st->device, ncclSuccess; }
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { return *rank = comm->st->rank, ncclSuccess; }

const char *ncclGetErrorString(ncclResult_t r)
{
    static const char *const names[] = {"no error", "unhandled cuda error", "unhandled system error",
                                        "internal error", "invalid argument", "invalid usage",
                                        "remote process exited or there was a network error",
                                        "NCCL operation in progress"};
    return r >= 0 && r < ncclNumResults ? names[r] : "unknown result code";
}

const char *ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return post({Pending::send, comm ? comm->st : nullptr, nullptr, buf, count, elem_size(type), type,
                 ncclSum, peer, stream});
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return post({Pending::recv, comm ? comm->st : nullptr, buf, nullptr, count, elem_size(type), type,
                 ncclSum, peer, stream});
}

ncclResult_t ncclAllReduce(const void *in, void *out, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return post({Pending::allreduce, comm ? comm->st : nullptr, out, in, count, elem_size(type), type,
                 op, 0, stream});
}

ncclResult_t ncclGroupStart(void) { return ++group_depth, ncclSuccess; }

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth == 0) emit(group);
    return ncclSuccess;
}

} // extern "C"
