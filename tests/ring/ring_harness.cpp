#include "ring/ring_harness.hpp"

#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "base/dtype.h"

namespace ringtest {

ringattn_plan_desc_t Problem::desc(ringattn_layout_t layout) const
{
    ringattn_plan_desc_t d = RINGATTN_PLAN_DESC_INIT;
    d.num_heads = H;
    d.num_kv_heads = Hkv;
    d.head_dim = D;
    d.head_dim_v = Dv;
    d.dtype = dtype;
    d.layout = layout;
    d.num_seqs = (int)cu.size() - 1;
    d.cu_seqlens = cu.data();
    d.causal = causal;
    d.window_left = wl;
    d.window_right = wr;
    d.softcap = softcap;
    d.alibi_slopes = alibi.empty() ? nullptr : alibi.data();
    d.key_bias_heads = key_bias_heads;
    d.keep_k = keep_k;
    d.num_threads = 1;
    d.block_q = 16; // small tiles: many tiles per shard even at test sizes
    d.block_k = 24;
    return d;
}

void Problem::quantize_bias()
{
    for (float &b : bias) b = std::round(2 * b) / 2;
}

void Problem::fill(uint64_t seed)
{
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    auto make = [&](std::vector<float> &f, std::vector<uint16_t> &h, size_t n) {
        f.resize(n);
        h.resize(n);
        for (size_t i = 0; i < n; ++i) {
            f[i] = n01(rng);
            h[i] = dtype == RINGATTN_FLOAT16 ? ra__f32_to_f16(f[i]) : ra__f32_to_bf16(f[i]);
        }
    };
    const size_t t = (size_t)T();
    make(q32, q16, t * H * D);
    make(k32, k16, t * Hkv * D);
    make(v32, v16, t * Hkv * Dv);
    make(do32, do16, t * H * Dv);
    bias.clear();
    if (key_bias_heads > 0) {
        std::normal_distribution<float> nb(0.0f, bias_sigma);
        bias.resize(t * (size_t)key_bias_heads);
        for (float &b : bias) b = nb(rng);
    }
}

namespace {

// Local rows (in the dtype's raw element size) of a global packed [T, heads, dim] tensor.
struct Local {
    std::vector<char> bytes;
    size_t elem;
    Local(size_t rows, size_t width, size_t e) : bytes(rows * width * e, 0), elem(e) {}
    void *data() { return bytes.data(); }
    float get(ringattn_dtype_t dt, size_t i) const
    {
        if (dt == RINGATTN_FLOAT32) return reinterpret_cast<const float *>(bytes.data())[i];
        uint16_t h;
        std::memcpy(&h, bytes.data() + i * 2, 2);
        return dt == RINGATTN_FLOAT16 ? ra__f16_to_f32(h) : ra__bf16_to_f32(h);
    }
};

Local gather(const Problem &pb, const std::vector<float> &f, const std::vector<uint16_t> &h,
             size_t width, const std::vector<int32_t> &idx)
{
    const size_t elem = pb.dtype == RINGATTN_FLOAT32 ? 4 : 2;
    Local l(idx.size(), width, elem);
    for (size_t r = 0; r < idx.size(); ++r) {
        const void *src = elem == 4 ? (const void *)&f[idx[r] * width] : (const void *)&h[idx[r] * width];
        std::memcpy(l.bytes.data() + r * width * elem, src, width * elem);
    }
    return l;
}

// NaN in every element: outputs are poisoned before each call (SPEC 10 case 7).
void poison(Local &l)
{
    if (l.elem == 4) {
        float *p = reinterpret_cast<float *>(l.bytes.data());
        for (size_t i = 0; i < l.bytes.size() / 4; ++i) p[i] = NAN;
    } else {
        std::memset(l.bytes.data(), 0xff, l.bytes.size()); // 0xffff: NaN in f16 and bf16
    }
}

} // namespace

static void rank_work(const Problem &pb, ringattn_comm_t comm, int rank, ringattn_layout_t layout,
                      const std::function<void(int, ringattn_plan_desc_t &)> &hook, Result &res,
                      std::mutex &mu)
{
    ringattn_plan_desc_t d = pb.desc(layout);
    if (hook) hook(rank, d);
    ringattn_plan_t plan = nullptr;
    ringattn_status_t st = ringattn_plan_create(comm, &d, &plan);
    if (st != RINGATTN_SUCCESS) {
        std::lock_guard<std::mutex> lk(mu);
        if (res.status == RINGATTN_SUCCESS) res.status = st;
        return;
    }
    int64_t n = 0;
    ringattn_plan_local_tokens(plan, &n, nullptr);
    std::vector<int32_t> idx((size_t)n);
    ringattn_plan_local_tokens(plan, &n, idx.data());
    const int H = pb.H, Hk = pb.Hkv, D = pb.D, Dv = pb.Dv;
    Local q = gather(pb, pb.q32, pb.q16, (size_t)H * D, idx);
    Local k = gather(pb, pb.k32, pb.k16, (size_t)Hk * D, idx);
    Local v = gather(pb, pb.v32, pb.v16, (size_t)Hk * Dv, idx);
    Local dout = gather(pb, pb.do32, pb.do16, (size_t)H * Dv, idx);
    Local o(idx.size(), (size_t)H * Dv, q.elem), dq(idx.size(), (size_t)H * D, q.elem);
    Local dk(idx.size(), (size_t)Hk * D, q.elem), dv(idx.size(), (size_t)Hk * Dv, q.elem);
    std::vector<float> lse((size_t)H * n + 1, NAN);
    // Bias columns of the local tokens, [H_b, n] packed; dBias the same shape, NaN until written.
    const int Hb = pb.key_bias_heads;
    const int64_t T = pb.T();
    std::vector<float> lbias((size_t)Hb * n + 1, NAN), ldbias((size_t)Hb * n + 1, NAN);
    for (int hb = 0; hb < Hb; ++hb)
        for (size_t r = 0; r < idx.size(); ++r)
            lbias[(size_t)hb * n + r] = pb.bias[(size_t)hb * T + idx[r]];
    poison(o);
    poison(dq);
    poison(dk);
    poison(dv);
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = q.data();
    t.k.data = k.data();
    t.v.data = v.data();
    t.o.data = o.data();
    t.lse = lse.data();
    t.dout.data = dout.data();
    t.dq.data = dq.data();
    t.dk.data = dk.data();
    t.dv.data = dv.data();
    t.key_bias = Hb > 0 ? lbias.data() : nullptr;
    t.dbias = Hb > 0 && pb.want_dbias ? ldbias.data() : nullptr;
    if (pb.edit_first_call) {
        ringattn_tensors_t edited = t;
        pb.edit_first_call(rank, edited);
        const ringattn_status_t first = ringattn_forward(plan, &edited, nullptr);
        std::lock_guard<std::mutex> lk(mu);
        res.edited_status[(size_t)rank] = first;
    }
    st = ringattn_forward(plan, &t, nullptr);
    if (st == RINGATTN_SUCCESS) st = ringattn_backward(plan, &t, nullptr);
    ringattn_plan_destroy(plan);
    std::lock_guard<std::mutex> lk(mu);
    if (st != RINGATTN_SUCCESS) {
        if (res.status == RINGATTN_SUCCESS) res.status = st;
        return;
    }
    for (size_t r = 0; r < idx.size(); ++r) {
        const size_t g = (size_t)idx[r];
        for (int i = 0; i < H * Dv; ++i) res.o[g * H * Dv + i] = o.get(pb.dtype, r * H * Dv + i);
        for (int i = 0; i < H * D; ++i) res.dq[g * H * D + i] = dq.get(pb.dtype, r * H * D + i);
        for (int i = 0; i < Hk * D; ++i) res.dk[g * Hk * D + i] = dk.get(pb.dtype, r * Hk * D + i);
        for (int i = 0; i < Hk * Dv; ++i)
            res.dv[g * Hk * Dv + i] = dv.get(pb.dtype, r * Hk * Dv + i);
        for (int h = 0; h < H; ++h) res.lse[(size_t)h * T + g] = lse[(size_t)h * n + r];
        if (pb.want_dbias)
            for (int hb = 0; hb < Hb; ++hb) res.dbias[(size_t)hb * T + g] = ldbias[(size_t)hb * n + r];
    }
}

static Result blank(const Problem &pb, float fill)
{
    const size_t T = (size_t)pb.T();
    Result res;
    res.o.assign(T * pb.H * pb.Dv, fill);
    res.lse.assign(T * pb.H, fill);
    res.dq.assign(T * pb.H * pb.D, fill);
    res.dk.assign(T * pb.Hkv * pb.D, fill);
    res.dv.assign(T * pb.Hkv * pb.Dv, fill);
    res.dbias.assign(pb.want_dbias ? T * (size_t)pb.key_bias_heads : 0, fill);
    return res;
}

Result run_rank(const Problem &pb, ringattn_comm_t comm, int rank, ringattn_layout_t layout,
                const std::function<void(int, ringattn_plan_desc_t &)> &hook)
{
    Result res = blank(pb, 0.0f);
    res.edited_status.assign((size_t)rank + 1, RINGATTN_ERR_INTERNAL);
    std::mutex mu;
    rank_work(pb, comm, rank, layout, hook, res, mu);
    return res;
}

Result run(const Problem &pb, int ranks, ringattn_layout_t layout,
           const std::function<void(int, ringattn_plan_desc_t &)> &hook)
{
    Result res = blank(pb, NAN);
    res.edited_status.assign((size_t)(ranks > 0 ? ranks : 1), RINGATTN_ERR_INTERNAL);
    std::mutex mu;
    if (ranks == 0) { // single-rank plan, no comm
        rank_work(pb, nullptr, 0, layout, hook, res, mu);
        return res;
    }
    std::vector<ringattn_comm_t> comms((size_t)ranks);
    res.status = ringattn_comm_create_threads(ranks, comms.data());
    if (res.status != RINGATTN_SUCCESS) return res;
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back(rank_work, std::cref(pb), comms[(size_t)r], r, layout, std::cref(hook),
                             std::ref(res), std::ref(mu));
    for (auto &th : threads) th.join();
    for (auto c : comms) ringattn_comm_destroy(c);
    return res;
}

} // namespace ringtest
