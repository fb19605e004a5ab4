#include <cstdlib>
#include "faults/fault_harness.hpp"

#include "support/alloc_fault.hpp"

#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <sstream>

namespace faults {

double now_s()
{
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

ringattn_plan_desc_t problem_desc()
{
    static const int32_t cu[] = {0, T};
    ringattn_plan_desc_t d = RINGATTN_PLAN_DESC_INIT;
    d.num_heads = H;
    d.head_dim = D;
    d.num_seqs = 1;
    d.cu_seqlens = cu;
    d.layout = RINGATTN_LAYOUT_ZIGZAG;
    d.backend = ratest::test_backend();
    // RATEST_ULYSSES = P_u: the scenarios on a 2D plan (groups of P_u consecutive ranks), so
    // that skipped, refused and stalled calls meet its all-to-all and its two comms
    if (const char *u = std::getenv("RATEST_ULYSSES")) d.ulysses_size = std::atoi(u);
    if (d.backend != RINGATTN_BACKEND_CPU) return d; // a device backend's tiles are its own
    d.block_q = 16; // several tiles (several cblas_sgemm calls) per ring step
    d.block_k = 16;
    d.num_threads = 1; // the kernels run on the calling thread: per-thread stalls reach them
    return d;
}

namespace {

// A generation's global inputs: [T, H, D] Q, K, V, dO from a seeded generator.
struct Inputs {
    std::vector<float> q, k, v, dout;
};

Inputs inputs(uint64_t gen)
{
    uint64_t s = gen * 0x9e3779b97f4a7c15ull + 1;
    auto next = [&s] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    };
    Inputs in;
    for (auto *t : {&in.q, &in.k, &in.v, &in.dout}) {
        t->resize((size_t)T * H * D);
        for (float &x : *t) x = next();
    }
    return in;
}

ringattn_tensors_t tensors(float *q, float *k, float *v, float *o, float *lse, float *dout,
                           float *dq, float *dk, float *dv)
{
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = q, t.k.data = k, t.v.data = v, t.o.data = o, t.lse = lse;
    t.dout.data = dout, t.dq.data = dq, t.dk.data = dk, t.dv.data = dv;
    return t;
}

bool differs(const std::vector<float> &got, const std::vector<float> &want_global,
             const std::vector<int32_t> &idx)
{
    const size_t w = (size_t)H * D;
    for (size_t r = 0; r < idx.size(); ++r)
        for (size_t i = 0; i < w; ++i) {
            const float a = got[r * w + i], b = want_global[(size_t)idx[r] * w + i];
            if (!(std::fabs(a - b) <= 1e-4f * (1.0f + std::fabs(b)))) return true; // NaN too
        }
    return false;
}

Outcome timed(const std::string &what, ringattn_status_t (*fn)(void *), void *ctx)
{
    Outcome o;
    o.what = what;
    const double t0 = now_s();
    o.status = fn(ctx);
    o.seconds = now_s() - t0;
    o.message = ringattn_last_error();
    return o;
}

} // namespace

const Reference &reference(uint64_t gen)
{
    static std::mutex mu;
    static std::map<uint64_t, Reference> cache;
    std::lock_guard<std::mutex> lk(mu);
    auto it = cache.find(gen);
    if (it != cache.end()) return it->second;
    Inputs in = inputs(gen);
    Reference &r = cache[gen];
    for (auto *t : {&r.o, &r.dq, &r.dk, &r.dv}) t->assign((size_t)T * H * D, NAN);
    std::vector<float> lse((size_t)H * T);
    ringattn_plan_desc_t d = problem_desc();
    d.backend = RINGATTN_BACKEND_CPU; // host tensors
    d.ulysses_size = 0;               // one rank
    ringattn_plan_t plan = nullptr;
    ringattn_tensors_t t = tensors(in.q.data(), in.k.data(), in.v.data(), r.o.data(), lse.data(),
                                   in.dout.data(), r.dq.data(), r.dk.data(), r.dv.data());
    if (ringattn_plan_create(nullptr, &d, &plan) != RINGATTN_SUCCESS ||
        ringattn_forward(plan, &t, nullptr) != RINGATTN_SUCCESS ||
        ringattn_backward(plan, &t, nullptr) != RINGATTN_SUCCESS)
        r.o.assign(r.o.size(), INFINITY); // every ring result then counts as wrong
    ringattn_plan_destroy(plan);
    return r;
}

enum { Q, K, V, O, LSE, DOUT, DQ, DK, DV };

Rank::Rank(ringattn_comm_t comm) : comm_(comm), stream_(ratest::device_memory().stream_create()) {}

Rank::~Rank()
{
    ringattn_plan_destroy(plan_);
    if (stream_) ratest::device_memory().stream_destroy(stream_);
}

Outcome Rank::create(ringattn_comm_t comm_to_pass)
{
    struct Ctx {
        Rank *self;
        ringattn_comm_t comm;
    } ctx{this, comm_to_pass};
    Outcome o = timed("plan_create", [](void *p) {
        Ctx *c = static_cast<Ctx *>(p);
        ringattn_plan_desc_t d = problem_desc();
        ringattn_plan_t plan = nullptr;
        const ringattn_status_t st = ringattn_plan_create(c->comm, &d, &plan);
        if (st == RINGATTN_SUCCESS) c->self->plan_ = plan;
        return st;
    }, &ctx);
    if (o.status == RINGATTN_SUCCESS) {
        int64_t n = 0;
        ringattn_plan_local_tokens(plan_, &n, nullptr);
        idx_.resize((size_t)n);
        ringattn_plan_local_tokens(plan_, &n, idx_.data());
    }
    return o;
}

void Rank::load(uint64_t gen)
{
    const Inputs in = inputs(gen);
    const size_t w = (size_t)H * D, n = idx_.size();
    auto rows = [&](const std::vector<float> &g, std::vector<float> &l) {
        l.resize(n * w);
        for (size_t r = 0; r < n; ++r)
            std::copy(g.begin() + (long)(idx_[r] * w), g.begin() + (long)((idx_[r] + 1) * w),
                      l.begin() + (long)(r * w));
    };
    rows(in.q, arrays_[Q].host), rows(in.k, arrays_[K].host), rows(in.v, arrays_[V].host);
    rows(in.dout, arrays_[DOUT].host);
    for (int i : {DQ, DK, DV}) arrays_[i].host.assign(n * w + 1, NAN); // poisoned
}

ringattn_tensors_t Rank::bind()
{
    float *a[9];
    for (int i = 0; i < 9; ++i) a[i] = arrays_[i].bind(stream_);
    return tensors(a[Q], a[K], a[V], a[O], a[LSE], a[DOUT], a[DQ], a[DK], a[DV]);
}

void Rank::download(std::initializer_list<int> outs)
{
    for (int i : outs) arrays_[i].dev.download(stream_);
}

Outcome Rank::forward(uint64_t gen, ringattn_plan_t plan_to_pass)
{
    load(gen);
    arrays_[O].host.assign(idx_.size() * H * D + 1, NAN); // poisoned
    arrays_[LSE].host.assign((size_t)H * idx_.size() + 1, NAN);
    forward_gen_ = gen;
    struct Ctx {
        Rank *self;
        ringattn_plan_t plan;
    } ctx{this, plan_to_pass};
    Outcome o = timed("forward(gen " + std::to_string(gen) + ")", [](void *p) {
        Ctx *c = static_cast<Ctx *>(p);
        const ringattn_tensors_t t = c->self->bind();
        return ringattn_forward(c->plan, &t, c->self->stream_);
    }, &ctx);
    if (o.status != RINGATTN_SUCCESS) return o;
    download({O, LSE});
    o.wrong = differs(arrays_[O].host, reference(gen).o, idx_);
    return o;
}

Outcome Rank::backward(uint64_t gen)
{
    load(gen);
    if (forward_gen_ != gen) { /* no forward of these inputs: zeros, judged only if it succeeds */
        arrays_[O].host.assign(idx_.size() * H * D + 1, 0.0f);
        arrays_[LSE].host.assign((size_t)H * idx_.size() + 1, 0.0f);
    }
    Outcome o = timed("backward(gen " + std::to_string(gen) + ")", [](void *p) {
        Rank &r = *static_cast<Rank *>(p);
        const ringattn_tensors_t t = r.bind();
        return ringattn_backward(r.plan_, &t, r.stream_);
    }, this);
    if (o.status != RINGATTN_SUCCESS) return o;
    download({DQ, DK, DV});
    const Reference &ref = reference(gen);
    o.wrong = differs(arrays_[DQ].host, ref.dq, idx_) || differs(arrays_[DK].host, ref.dk, idx_) ||
              differs(arrays_[DV].host, ref.dv, idx_);
    return o;
}

Outcome Rank::destroy_plan()
{
    Outcome o = timed("plan_destroy", [](void *p) {
        return ringattn_plan_destroy(static_cast<ringattn_plan_t>(p));
    }, plan_);
    plan_ = nullptr;
    return o;
}

Outcome create_big_plan(ringattn_comm_t comm, bool out_of_memory)
{
    static const int32_t cu[] = {0, BIG_T};
    ringattn_plan_desc_t d = problem_desc();
    d.cu_seqlens = cu;
    ringattn_plan_t plan = nullptr;
    Outcome o;
    o.what = "plan_create(T " + std::to_string(BIG_T) + ")";
    if (out_of_memory) allocfault::arm(512 << 10);
    const double t0 = now_s();
    o.status = ringattn_plan_create(comm, &d, &plan);
    o.seconds = now_s() - t0;
    const long refused = allocfault::refused();
    allocfault::disarm();
    o.message = ringattn_last_error();
    if (out_of_memory) o.message += " [allocations refused here: " + std::to_string(refused) + "]";
    o.wrong = (o.status == RINGATTN_SUCCESS) != (plan != nullptr);
    ringattn_plan_destroy(plan);
    return o;
}

Worker::Worker()
    : thread_([this] {
          std::unique_lock<std::mutex> lk(mu_);
          for (;;) {
              cv_.wait(lk, [this] { return quit_ || task_; });
              if (!task_) return;
              task_();
              task_ = nullptr;
              cv_.notify_all();
          }
      })
{
}

Worker::~Worker()
{
    {
        std::lock_guard<std::mutex> lk(mu_);
        quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

Outcome Worker::run(const std::function<Outcome()> &task)
{
    Outcome out;
    std::unique_lock<std::mutex> lk(mu_);
    task_ = [&] { out = task(); };
    cv_.notify_all();
    cv_.wait(lk, [this] { return !task_; });
    return out;
}

std::string describe(const std::vector<Outcome> &outs)
{
    std::ostringstream s;
    for (const Outcome &o : outs)
        s << "  " << o.what << ": " << ringattn_status_string(o.status) << " in " << o.seconds
          << " s" << (o.wrong ? " WITH WRONG DATA" : "") << (o.message.empty() ? "" : ": ")
          << o.message << "\n";
    return s.str();
}

} // namespace faults
