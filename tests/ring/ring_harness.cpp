#include "ring/ring_harness.hpp"
#include "ring/mailbox_transport.hpp"
#include "support/digest.hpp"

#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/dtype.h"
#include "support/device.hpp"

namespace ringtest {

using ratest::Problem;
using ratest::TView;

namespace {

// One rank's rows of a global packed tensor (raw elements of its dtype), with its mirror for
// the backend under test.
struct Local {
    std::vector<unsigned char> bytes;
    size_t elem;
    ratest::Mirror dev;
    Local(size_t rows, size_t width, size_t e) : bytes(rows * width * e + e, 0), elem(e) {}
    void *device() { return dev.bind(bytes.data(), bytes.size()); }
    float get(ringattn_dtype_t dt, size_t i) const
    {
        float f;
        ra__load_f32(&f, bytes.data() + i * elem, dt, 1);
        return f;
    }
    void poison() { std::memset(bytes.data(), 0xff, bytes.size()); } // NaN in every dtype
};

Local gather(const TView &g, const std::vector<int32_t> &idx)
{
    const size_t elem = ratest::dtype_size(g.buf->dtype), width = (size_t)g.heads * g.dim;
    Local l(idx.size(), width, elem);
    for (size_t r = 0; r < idx.size(); ++r)
        std::memcpy(l.bytes.data() + r * width * elem,
                    g.buf->bytes.data() + ((size_t)g.off + (size_t)idx[r] * width) * elem,
                    width * elem);
    return l;
}

struct Shared {
    std::mutex mu;
    Result &res;
    void fail(int rank, ringattn_status_t st)
    {
        std::lock_guard<std::mutex> lk(mu);
        if (res.status == RINGATTN_SUCCESS) res.status = st;
        if ((size_t)rank >= res.rank_status.size()) return;
        res.rank_status[(size_t)rank] = st;
        res.rank_error[(size_t)rank] = ringattn_last_error(); // of this rank's thread
    }
};

// Writes a rank's local rows r of `l` ([rows, width]) into global rows idx[r] of `out`.
void scatter_rows(std::vector<float> &out, const Local &l, ringattn_dtype_t dt, size_t width,
                  const std::vector<int32_t> &idx)
{
    for (size_t r = 0; r < idx.size(); ++r)
        for (size_t i = 0; i < width; ++i)
            out[(size_t)idx[r] * width + i] = l.get(dt, r * width + i);
}

void rank_work(const Problem &pb, ringattn_comm_t comm, int rank, ringattn_layout_t layout,
               const RunOptions &opt, Shared &sh)
{
    const ratest::AttnConfig &c = pb.cfg;
    ringattn_plan_desc_t d = ratest::make_desc(c);
    d.layout = layout;
    if (opt.desc_hook) opt.desc_hook(rank, d);
    ringattn_plan_t plan = nullptr;
    ringattn_status_t st = opt.make_plan ? opt.make_plan(rank, comm, d, &plan)
                                         : ringattn_plan_create(comm, &d, &plan);
    if (st != RINGATTN_SUCCESS) return sh.fail(rank, st);
    if (rank == opt.leave_rank) {
        ringattn_plan_destroy(plan);
        return;
    }
    int64_t n = 0;
    ringattn_plan_local_tokens(plan, &n, nullptr);
    std::vector<int32_t> idx((size_t)n);
    ringattn_plan_local_tokens(plan, &n, idx.data());
    std::vector<int32_t> kidx = idx; // the keys: this rank's tokens, or every key on one rank
    if (!comm) {
        kidx.resize((size_t)c.Tk());
        for (size_t i = 0; i < kidx.size(); ++i) kidx[i] = (int32_t)i;
    }
    const int H = c.H, Hk = c.hkv(), D = c.D, Dv = c.dv(), Hb = c.key_bias_heads;
    const size_t nk = kidx.size(), e = ratest::dtype_size(c.dtype);
    Local q = gather(pb.q, idx), k = gather(pb.k, kidx), v = gather(pb.v, kidx);
    Local dout = gather(pb.dout, idx);
    Local o(idx.size(), (size_t)H * Dv, e), dq(idx.size(), (size_t)H * D, e);
    Local dk(nk, (size_t)Hk * D, e), dv(nk, (size_t)Hk * Dv, e);
    for (Local *x : {&o, &dq, &dk, &dv}) x->poison(); // SPEC 10 case 7
    ratest::Mirrored<float> lse, bias, dbias, sinks, dsinks, dlse;
    lse.host.assign((size_t)H * n + 1, NAN);
    // SPEC 11: the sinks, the same on every rank; dlse of the local rows; this rank's dsinks
    sinks.host = pb.sinks_buf;
    dsinks.host.assign(pb.sinks_buf.size(), NAN);
    if (!pb.dlse_buf.empty()) {
        dlse.host.assign((size_t)H * n + 1, NAN);
        for (int h = 0; h < H; ++h)
            for (size_t r = 0; r < (size_t)n; ++r)
                dlse.host[(size_t)h * n + r] = pb.dlse_buf[(size_t)h * c.Tq() + (size_t)idx[r]];
    }
    // the bias columns of the local keys, [H_b, nk] packed; dBias the same, NaN until written
    bias.host.assign((size_t)Hb * nk + 1, NAN);
    dbias.host.assign(bias.host.size(), NAN);
    const int64_t Tk = c.Tk();
    for (int hb = 0; hb < Hb; ++hb)
        for (size_t r = 0; r < nk; ++r)
            bias.host[(size_t)hb * nk + r] = pb.bias_buf[(size_t)hb * Tk + (size_t)kidx[r]];
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = q.device();
    t.k.data = k.device();
    t.v.data = v.device();
    t.o.data = o.device();
    t.lse = lse.bind();
    t.dout.data = dout.device();
    t.dq.data = dq.device();
    t.dk.data = dk.device();
    t.dv.data = dv.device();
    t.key_bias = Hb > 0 ? bias.bind() : nullptr;
    t.dbias = Hb > 0 && pb.want_dbias ? dbias.bind() : nullptr;
    t.sinks = sinks.host.empty() ? nullptr : sinks.bind();
    t.dsinks = sinks.host.empty() ? nullptr : dsinks.bind();
    t.dlse = dlse.host.empty() ? nullptr : dlse.bind();
    // each rank's calls on a stream of their own (a device backend): the ring's order between
    // them is the transport's events alone
    ratest::DeviceMemory &mem = ratest::device_memory();
    void *stream = opt.default_stream ? nullptr : mem.stream_create();
    if (opt.edit_first_call) {
        ringattn_tensors_t edited = t;
        opt.edit_first_call(rank, edited);
        const ringattn_status_t first = ringattn_forward(plan, &edited, stream);
        std::lock_guard<std::mutex> lk(sh.mu);
        sh.res.edited_status[(size_t)rank] = first;
    }
    if (opt.capture_first_call) {
        using begin_t = int (*)(void *, int);
        using end_t = int (*)(void *, void **);
        using destroy_t = int (*)(void *);
        const auto begin = reinterpret_cast<begin_t>(dlsym(RTLD_DEFAULT, "cudaStreamBeginCapture"));
        const auto end = reinterpret_cast<end_t>(dlsym(RTLD_DEFAULT, "cudaStreamEndCapture"));
        const auto destroy = reinterpret_cast<destroy_t>(dlsym(RTLD_DEFAULT, "cudaGraphDestroy"));
        ringattn_status_t first = RINGATTN_ERR_INTERNAL; // stays so when no capture could begin
        if (begin && end && stream && begin(stream, 2 /* cudaStreamCaptureModeRelaxed */) == 0) {
            first = ringattn_forward(plan, &t, stream);
            void *graph = nullptr;
            end(stream, &graph);
            if (graph && destroy) destroy(graph);
        }
        std::lock_guard<std::mutex> lk(sh.mu);
        sh.res.edited_status[(size_t)rank] = first;
    }
    st = ringattn_forward(plan, &t, stream);
    if (st == RINGATTN_SUCCESS) st = ringattn_backward(plan, &t, stream);
    if (opt.after_calls) opt.after_calls(rank);
    ringattn_plan_destroy(plan);
    if (st == RINGATTN_SUCCESS) { // downloads wait for the device
        for (Local *x : {&o, &dq, &dk, &dv}) x->dev.download();
        lse.dev.download();
        dbias.dev.download();
        dsinks.dev.download();
    }
    if (stream) mem.stream_destroy(stream);
    if (st != RINGATTN_SUCCESS) return sh.fail(rank, st);
    std::lock_guard<std::mutex> lk(sh.mu);
    Result &res = sh.res;
    scatter_rows(res.o, o, c.dtype, (size_t)H * Dv, idx);
    scatter_rows(res.dq, dq, c.dtype, (size_t)H * D, idx);
    scatter_rows(res.dk, dk, c.dtype, (size_t)Hk * D, kidx);
    scatter_rows(res.dv, dv, c.dtype, (size_t)Hk * Dv, kidx);
    const size_t Tq = (size_t)c.Tq();
    for (int h = 0; h < H; ++h)
        for (size_t r = 0; r < idx.size(); ++r)
            res.lse[(size_t)h * Tq + (size_t)idx[r]] = lse.host[(size_t)h * n + r];
    if (!res.dbias.empty())
        for (int hb = 0; hb < Hb; ++hb)
            for (size_t r = 0; r < nk; ++r)
                res.dbias[(size_t)hb * Tk + (size_t)kidx[r]] = dbias.host[(size_t)hb * nk + r];
    if (!dsinks.host.empty()) { // each rank's part, summed in rank order by Result::got
        if (res.dsinks_ranks.size() < (size_t)(rank + 1) * H)
            res.dsinks_ranks.resize((size_t)(rank + 1) * H, 0.0f);
        for (int h = 0; h < H; ++h) res.dsinks_ranks[(size_t)rank * H + h] = dsinks.host[(size_t)h];
    }
}


ratest::Dense dense(const std::vector<float> &v, int64_t T, int heads, int dim)
{
    ratest::Dense d(T, heads, dim);
    for (size_t i = 0; i < d.v.size(); ++i) d.v[i] = v[i];
    return d;
}

using MakeComm = std::function<ringattn_status_t(int, int, ringattn_comm_t *)>;

// Each rank a thread on a comm of its own, made and destroyed there.
Result &run_own_comms(const Problem &pb, int ranks, ringattn_layout_t layout,
                      const RunOptions &opt, const MakeComm &make, Result &res)
{
    Shared sh{{}, res};
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
            ringattn_comm_t comm = nullptr;
            const ringattn_status_t st = make(r, ranks, &comm);
            if (st != RINGATTN_SUCCESS) return sh.fail(r, st);
            rank_work(pb, comm, r, layout, opt, sh);
            ringattn_comm_destroy(comm);
        });
    for (auto &th : threads) th.join();
    return res;
}

} // namespace

NcclEntry nccl_entry()
{
    NcclEntry e;
    e.get_id = reinterpret_cast<int (*)(void *)>(dlsym(RTLD_DEFAULT, "ncclGetUniqueId"));
    e.create = reinterpret_cast<decltype(e.create)>(dlsym(RTLD_DEFAULT, "ringattn_comm_create_nccl_id"));
    return e;
}

Result blank(const Problem &pb, float fill)
{
    const ratest::AttnConfig &c = pb.cfg;
    const size_t Tq = (size_t)c.Tq(), Tk = (size_t)c.Tk();
    Result res;
    res.o.assign(Tq * c.H * c.dv(), fill);
    res.lse.assign(Tq * c.H, fill);
    res.dq.assign(Tq * c.H * c.D, fill);
    res.dk.assign(Tk * c.hkv() * c.D, fill);
    res.dv.assign(Tk * c.hkv() * c.dv(), fill);
    res.dbias.assign(pb.want_dbias ? Tk * (size_t)c.key_bias_heads : 0, fill);
    return res;
}

ratest::Got Result::got(const ratest::AttnConfig &c) const
{
    ratest::Got g;
    g.O = dense(o, c.Tq(), c.H, c.dv());
    g.lse.assign(lse.begin(), lse.end());
    g.dQ = dense(dq, c.Tq(), c.H, c.D);
    g.dK = dense(dk, c.Tk(), c.hkv(), c.D);
    g.dV = dense(dv, c.Tk(), c.hkv(), c.dv());
    if (!dbias.empty()) g.dBias = dense(dbias, c.key_bias_heads, 1, c.Tk());
    if (!dsinks_ranks.empty()) { // SPEC 11: the ranks' parts of a replicated parameter's gradient
        g.dSinks = ratest::Dense(1, c.H, 1);
        for (size_t i = 0; i < dsinks_ranks.size(); ++i) g.dSinks.v[i % (size_t)c.H] += dsinks_ranks[i];
    }
    return g;
}

// The harness reads the global inputs row by row: they must be packed (Storage::Packed).
static void require_packed(const Problem &pb)
{
    for (const TView *t : {&pb.q, &pb.k, &pb.v, &pb.dout}) {
        INFO("ring harness: the problem's inputs must be packed (Storage::Packed)");
        REQUIRE((t->rs == (int64_t)t->heads * t->dim && t->hs == t->dim));
    }
}

Result run_rank(const Problem &pb, ringattn_comm_t comm, int rank, ringattn_layout_t layout,
                const RunOptions &opt)
{
    require_packed(pb);
    Result res = blank(pb, 0.0f);
    res.edited_status.assign((size_t)rank + 1, RINGATTN_ERR_INTERNAL);
    res.rank_status.assign((size_t)rank + 1, RINGATTN_SUCCESS);
    res.rank_error.assign((size_t)rank + 1, "");
    Shared sh{{}, res};
    rank_work(pb, comm, rank, layout, opt, sh);
    return res;
}

std::string test_transport()
{
    const char *env = std::getenv("RATEST_TRANSPORT");
    const std::string t = env && *env ? env : "threads";
    if (t != "threads" && t != "custom" && t != "nccl")
        throw std::invalid_argument("RATEST_TRANSPORT: got '" + t +
                                    "', expected threads, custom or nccl");
    return t;
}

static Result run_ring(const Problem &pb, int ranks, ringattn_layout_t layout,
                       const RunOptions &opt)
{
    require_packed(pb);
    Result res = blank(pb, NAN);
    res.edited_status.assign((size_t)(ranks > 0 ? ranks : 1), RINGATTN_ERR_INTERNAL);
    res.rank_status.assign((size_t)(ranks > 0 ? ranks : 1), RINGATTN_SUCCESS);
    res.rank_error.assign(res.rank_status.size(), "");
    Shared sh{{}, res};
    if (ranks == 0) { // single-rank plan, no comm
        rank_work(pb, nullptr, 0, layout, opt, sh);
        return res;
    }
    if (opt.nccl) { // each rank on its own communicator from one unique id
        const NcclEntry nccl = nccl_entry();
        if (!nccl) {
            res.status = RINGATTN_ERR_UNSUPPORTED;
            return res;
        }
        unsigned char id[128];
        REQUIRE(nccl.get_id(id) == 0);
        return run_own_comms(pb, ranks, layout, opt, [&](int r, int n, ringattn_comm_t *comm) {
            return nccl.create(id, n, r, -1, comm);
        }, res);
    }
    if (opt.make_comm) return run_own_comms(pb, ranks, layout, opt, opt.make_comm, res);
    const std::string transport = test_transport();
    if (transport == "nccl") { // the transport under test (RATEST_TRANSPORT)
        RunOptions o = opt;
        o.nccl = true;
        return run_ring(pb, ranks, layout, o);
    }
    if (transport == "custom") {
        mailbox::Network net;
        RunOptions o = opt;
        o.make_comm = net.options().make_comm;
        return run_ring(pb, ranks, layout, o);
    }
    std::vector<ringattn_comm_t> comms((size_t)ranks);
    res.status = make_thread_comms(ranks, comms.data());
    if (res.status != RINGATTN_SUCCESS) return res;
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back(rank_work, std::cref(pb), comms[(size_t)r], r, layout, std::cref(opt),
                             std::ref(sh));
    for (auto &th : threads) th.join();
    for (auto c : comms) ringattn_comm_destroy(c);
    return res;
}

Result run(const Problem &pb, int ranks, ringattn_layout_t layout, const RunOptions &opt)
{
    Result res = run_ring(pb, ranks, layout, opt);
    auto floats = [](const std::vector<float> &v) {
        return ratest::Bytes{v.data(), v.size() * sizeof(float)};
    };
    ratest::digest("ring", {floats(res.o), floats(res.lse), floats(res.dq), floats(res.dk),
                            floats(res.dv), floats(res.dbias)});
    return res;
}

} // namespace ringtest
