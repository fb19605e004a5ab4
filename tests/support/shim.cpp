#include "support/shim.hpp"
#include "support/digest.hpp"
#include "support/spec9.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace ratest {

ringattn_plan_desc_t make_desc(const AttnConfig &cfg)
{
    ringattn_plan_desc_t d = RINGATTN_PLAN_DESC_INIT;
    d.num_heads = cfg.H;
    d.num_kv_heads = cfg.Hkv;
    d.head_dim = cfg.D;
    d.head_dim_v = cfg.Dv;
    d.dtype = cfg.dtype;
    d.layout = cfg.layout;
    d.num_seqs = cfg.num_seqs();
    d.cu_seqlens = cfg.cu_q.data();
    d.cu_seqlens_k = cfg.cu_k.empty() ? nullptr : cfg.cu_k.data();
    d.causal = cfg.causal ? 1 : 0;
    d.window_left = cfg.wl;
    d.window_right = cfg.wr;
    d.softmax_scale = cfg.scale;
    d.softcap = cfg.softcap;
    d.alibi_slopes = cfg.alibi.empty() ? nullptr : cfg.alibi.data();
    d.key_bias_heads = cfg.key_bias_heads;
    d.keep_k = cfg.keep_k;
    d.num_threads = cfg.num_threads;
    d.precision = cfg.precision;
    d.backend = test_backend();
    if (d.backend == RINGATTN_BACKEND_CPU || cfg.cpu_tiles_everywhere) {
        d.block_q = cfg.block_q;
        d.block_k = cfg.block_k;
    }
    return d;
}

ringattn_status_t Plan::create(const AttnConfig &cfg)
{
    reset();
    ringattn_plan_desc_t d = make_desc(cfg);
    st_ = ringattn_plan_create(nullptr, &d, &p_);
    if (st_ != RINGATTN_SUCCESS) p_ = nullptr;
    return st_;
}

void Plan::reset()
{
    if (p_) ringattn_plan_destroy(p_);
    p_ = nullptr;
    st_ = RINGATTN_ERR_INTERNAL;
}

Problem::Problem(const AttnConfig &c, Storage st, std::mt19937_64 &rng, double sigma_qk,
                 double sigma_bias)
    : cfg(c)
{
    const ringattn_dtype_t dt = cfg.dtype;
    const int H = cfg.H, Hkv = cfg.hkv(), D = cfg.D, Dv = cfg.dv();
    const int64_t Tq = cfg.Tq(), Tk = cfg.Tk();
    // the CUDA backend loads Q, K and V in 16-byte chunks: their padding is whole chunks there
    if (on_cuda() && st == Storage::Padded) st = Storage::PaddedAligned;
    if (on_cuda() && st == Storage::Interleaved) st = Storage::InterleavedAligned;
    switch (st) {
    case Storage::Packed:
    case Storage::PackedZero: {
        const bool z = st == Storage::PackedZero;
        q = make_packed(dt, Tq, H, D, z);
        k = make_packed(dt, Tk, Hkv, D, z);
        v = make_packed(dt, Tk, Hkv, Dv, z);
        o = make_packed(dt, Tq, H, Dv, z);
        dout = make_packed(dt, Tq, H, Dv, z);
        dq = make_packed(dt, Tq, H, D, z);
        dk = make_packed(dt, Tk, Hkv, D, z);
        dv = make_packed(dt, Tk, Hkv, Dv, z);
        break;
    }
    case Storage::Padded:
    case Storage::PaddedAligned: {
        // Q, K, V: odd (head, row) padding, or whole 16-byte chunks of u elements; the other
        // tensors odd in both
        const bool odd = st == Storage::Padded;
        const int u = (int)(16 / dtype_size(dt));
        q = odd ? make_padded(dt, Tq, H, D, 3, 5) : make_padded(dt, Tq, H, D, u, 2 * u);
        k = odd ? make_padded(dt, Tk, Hkv, D, 1, 7) : make_padded(dt, Tk, Hkv, D, 2 * u, u);
        v = make_padded(dt, Tk, Hkv, Dv, odd ? 2 : u, 0);
        o = make_padded(dt, Tq, H, Dv, 5, 3);
        dout = make_padded(dt, Tq, H, Dv, 1, 1);
        dq = make_padded(dt, Tq, H, D, 2, 9);
        dk = make_padded(dt, Tk, Hkv, D, 4, 1);
        dv = make_padded(dt, Tk, Hkv, Dv, 0, 6);
        break;
    }
    case Storage::Interleaved:
    case Storage::InterleavedAligned:
        REQUIRE(Tq == Tk);
        make_interleaved(dt, Tq, H, D, Hkv, D, Hkv, Dv,
                         st == Storage::Interleaved ? 3 : (int)(16 / dtype_size(dt)), q, k, v);
        make_interleaved(dt, Tq, H, D, Hkv, D, Hkv, Dv, 1, dq, dk, dv);
        o = make_padded(dt, Tq, H, Dv, 0, 4);
        dout = make_padded(dt, Tq, H, Dv, 2, 0);
        break;
    }
    fill_normal(q, rng, sigma_qk);
    fill_normal(k, rng, sigma_qk);
    fill_normal(v, rng, 1.0);
    fill_normal(dout, rng, 1.0);
    lse.assign((size_t)std::max<int64_t>(1, H * Tq), NAN);
    // (drawn after everything else, so problems without a bias see the same random inputs as
    // before biases existed)
    std::vector<double> b = cfg.bias;
    if (cfg.key_bias_heads > 0 && b.size() != bias_elems()) {
        std::normal_distribution<double> nd(0.0, sigma_bias);
        b.resize(bias_elems());
        for (double &x : b) x = nd(rng);
    }
    set_bias(cfg.key_bias_heads > 0 ? b : std::vector<double>());
    auto as_float = [](std::vector<double> &x, std::vector<float> &buf) {
        buf.assign(x.begin(), x.end());
        for (size_t i = 0; i < x.size(); ++i) x[i] = (double)buf[i];
    };
    as_float(cfg.sinks, sinks_buf);
    as_float(cfg.dlse, dlse_buf);
    dsinks_buf.assign(sinks_buf.size(), NAN);
}

void Problem::set_bias(const std::vector<double> &b)
{
    const size_t n = b.size();
    cfg.bias.resize(n);
    bias_buf.assign(n + BIAS_GUARD, NAN);
    for (size_t i = 0; i < n; ++i) {
        bias_buf[i] = (float)b[i];
        cfg.bias[i] = (double)bias_buf[i];
    }
    dbias_buf.assign(n + BIAS_GUARD, DBIAS_SENTINEL);
    std::fill(dbias_buf.begin(), dbias_buf.begin() + (ptrdiff_t)n, NAN);
}

Dense Problem::dbias_dense() const
{
    Dense d(cfg.key_bias_heads, 1, cfg.Tk());
    for (size_t i = 0; i < d.v.size(); ++i) d.v[i] = dbias_buf[i];
    return d;
}

ringattn_tensors_t Problem::tensors()
{
    ringattn_tensors_t t;
    std::memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    t.q = q.desc();
    t.k = k.desc();
    t.v = v.desc();
    t.o = o.desc();
    t.lse = static_cast<float *>(lse_dev.bind(lse.data(), lse.size() * sizeof(float)));
    t.dout = dout.desc();
    t.dq = dq.desc();
    t.dk = dk.desc();
    t.dv = dv.desc();
    t.key_bias = cfg.key_bias_heads > 0 ? bias_device() : nullptr;
    t.dbias = cfg.key_bias_heads > 0 && want_dbias
                  ? static_cast<float *>(dbias_dev.bind(dbias_buf.data(), dbias_buf.size() * sizeof(float)))
                  : nullptr;
    auto bind = [](Mirror &m, std::vector<float> &buf) {
        return buf.empty() ? nullptr : static_cast<float *>(m.bind(buf.data(), buf.size() * sizeof(float)));
    };
    t.sinks = bind(sinks_dev, sinks_buf);
    t.dsinks = bind(dsinks_dev, dsinks_buf);
    t.dlse = bind(dlse_dev, dlse_buf);
    return t;
}

void Problem::from_device()
{
    for (TView *t : {&o, &dq, &dk, &dv})
        if (t->buf) t->buf->dev.download();
    lse_dev.download();
    dbias_dev.download();
    dsinks_dev.download();
}

void Problem::poison_forward_outputs()
{
    o.poison();
    std::fill(lse.begin(), lse.end(), NAN);
}

void Problem::poison_backward_outputs()
{
    dq.poison();
    dk.poison();
    dv.poison();
    const size_t n = std::min(bias_elems(), dbias_buf.size());
    std::fill(dbias_buf.begin(), dbias_buf.begin() + (ptrdiff_t)n, NAN);
    std::fill(dsinks_buf.begin(), dsinks_buf.end(), NAN);
}

ringattn_status_t run_forward(const Plan &plan, Problem &pb)
{
    ringattn_tensors_t t = pb.tensors();
    const ringattn_status_t st = ringattn_forward(plan.get(), &t, nullptr);
    pb.from_device();
    digest("forward", {{pb.o.buf->bytes.data(), pb.o.buf->bytes.size()},
                       {pb.lse.data(), pb.lse.size() * sizeof(float)}});
    return st;
}

ringattn_status_t run_backward(const Plan &plan, Problem &pb)
{
    ringattn_tensors_t t = pb.tensors();
    const ringattn_status_t st = ringattn_backward(plan.get(), &t, nullptr);
    pb.from_device();
    auto bytes = [](const TView &v) {
        return v.buf ? Bytes{v.buf->bytes.data(), v.buf->bytes.size()} : Bytes{nullptr, 0};
    };
    digest("backward", {bytes(pb.dq), bytes(pb.dk), bytes(pb.dv),
                        {pb.dbias_buf.data(), pb.dbias_buf.size() * sizeof(float)}});
    return st;
}

std::vector<int32_t> cu_from_lengths(const std::vector<int> &lens)
{
    std::vector<int32_t> cu(1, 0);
    for (int l : lens) cu.push_back(cu.back() + l);
    return cu;
}

std::vector<float> alibi_slopes(int H)
{
    std::vector<float> s((size_t)H);
    for (int h = 0; h < H; ++h) s[(size_t)h] = (float)std::pow(2.0, -8.0 * (h + 1) / H);
    return s;
}

namespace {

// Group views by buffer and check the bytes outside them are unchanged.
struct BufferSnap {
    std::vector<unsigned char> bytes;
    std::vector<const TView *> views;
};
using Snaps = std::map<const Buffer *, BufferSnap>;

Snaps take(const std::vector<const TView *> &views)
{
    Snaps s;
    for (const TView *v : views) {
        BufferSnap &b = s[v->buf.get()];
        if (b.views.empty()) b.bytes = v->buf->bytes;
        b.views.push_back(v);
    }
    return s;
}

bool padding_ok(const Snaps &s)
{
    for (auto &kv : s)
        if (!padding_unchanged(kv.second.bytes, kv.second.views)) return false;
    return true;
}

bool whole_buffers_unchanged(const Snaps &s)
{
    for (auto &kv : s)
        if (kv.second.bytes != kv.first->bytes) return false;
    return true;
}

// Rows with no allowed key (reference LSE -inf): LSE exactly -inf and O exactly 0; every other
// row has a finite LSE. Returns the number of violating rows.
int64_t empty_row_violations(const AttnConfig &cfg, const std::vector<double> &ref_lse,
                             const std::vector<float> &lse, const TView &o)
{
    int64_t bad = 0;
    const int64_t Tq = cfg.Tq();
    for (int h = 0; h < cfg.H; ++h)
        for (int64_t t = 0; t < Tq; ++t) {
            const double r = ref_lse[(size_t)(h * Tq + t)];
            const float g = lse[(size_t)(h * Tq + t)];
            if (std::isinf(r) && r < 0) {
                bool row_ok = std::isinf(g) && g < 0;
                for (int c = 0; c < cfg.dv(); ++c) row_ok = row_ok && o.get(t, h, c) == 0.0;
                bad += !row_ok;
            } else if (!std::isfinite(g)) {
                ++bad;
            }
        }
    return bad;
}

int64_t nonzero_dq_rows(const AttnConfig &cfg, const std::vector<double> &ref_lse, const TView &dq)
{
    int64_t bad = 0;
    const int64_t Tq = cfg.Tq();
    for (int h = 0; h < cfg.H; ++h)
        for (int64_t t = 0; t < Tq; ++t) {
            if (!std::isinf(ref_lse[(size_t)(h * Tq + t)])) continue;
            for (int c = 0; c < cfg.D; ++c)
                if (dq.get(t, h, c) != 0.0) {
                    ++bad;
                    break;
                }
        }
    return bad;
}

std::vector<unsigned char> view_bits(const TView &v)
{
    std::vector<unsigned char> out;
    for (int64_t t = 0; t < v.T; ++t)
        for (int h = 0; h < v.heads; ++h)
            for (int c = 0; c < v.dim; ++c) {
                uint64_t b = v.bits(t, h, c);
                const unsigned char *p = reinterpret_cast<const unsigned char *>(&b);
                out.insert(out.end(), p, p + 8);
            }
    return out;
}

} // namespace

#define CK(expr)                                                                                   \
    do {                                                                                           \
        if (!(expr)) ok = false;                                                                   \
        CHECK(expr);                                                                               \
    } while (0)

bool check_against_oracle(const Plan &plan, Problem &pb, const CheckOptions &opt)
{
    const AttnConfig &cfg = pb.cfg;
    INFO("config: " << cfg.describe());
    bool ok = true;
    REQUIRE(plan.ok());

    // the bias buffer is what cfg.bias says (a test that edits cfg.bias must use set_bias)
    const bool with_bias = cfg.key_bias_heads > 0;
    REQUIRE(pb.bias_buf.size() == pb.bias_elems() + Problem::BIAS_GUARD);
    for (size_t i = 0; i < pb.bias_elems(); ++i) REQUIRE((double)pb.bias_buf[i] == cfg.bias[i]);
    const std::vector<float> bias_before = pb.bias_buf;
    auto bias_unchanged = [&] {
        return std::memcmp(bias_before.data(), pb.bias_buf.data(), bias_before.size() * sizeof(float)) == 0;
    };

    const Snaps in_snap = take({&pb.q, &pb.k, &pb.v, &pb.dout});
    pb.poison_forward_outputs();
    const Snaps o_snap = take({&pb.o});
    ringattn_status_t st = run_forward(plan, pb);
    INFO("forward status " << ringattn_status_string(st) << ": " << ringattn_last_error());
    CK(st == RINGATTN_SUCCESS);
    if (st != RINGATTN_SUCCESS) return false;
    CK(padding_ok(o_snap));
    CK(whole_buffers_unchanged(in_snap));
    CK(bias_unchanged());

    const Dense Q = pb.q.to_dense(), K = pb.k.to_dense(), V = pb.v.to_dense(),
                dO = pb.dout.to_dense();
    const FwdResult ref = oracle_forward(cfg, Q, K, V);
    Got got;
    got.O = pb.o.to_dense();
    const std::vector<double> lse = pb.lse_d();
    got.lse.assign(lse.begin(), lse.begin() + (ptrdiff_t)ref.lse.size());

    const bool o_nonfinite = pb.o.any_nonfinite();
    CK(!o_nonfinite);
    const int64_t bad_rows = empty_row_violations(cfg, ref.lse, pb.lse, pb.o);
    CK(bad_rows == 0);

    std::vector<unsigned char> o_bits, lse_bits;
    if (opt.check_determinism) {
        o_bits = view_bits(pb.o);
        lse_bits.assign(reinterpret_cast<const unsigned char *>(pb.lse.data()),
                        reinterpret_cast<const unsigned char *>(pb.lse.data() + pb.lse.size()));
        pb.poison_forward_outputs();
        CK(run_forward(plan, pb) == RINGATTN_SUCCESS);
        CK(view_bits(pb.o) == o_bits);
        CK(std::memcmp(lse_bits.data(), pb.lse.data(), lse_bits.size()) == 0);
    }
    Spec9Options judge;
    judge.backward = opt.backward;
    judge.exact_logits = opt.exact_logits;
    if (!opt.backward) return spec9_check(cfg, Q, K, V, dO, got, judge) && ok;

    const Snaps in2 = take({&pb.q, &pb.k, &pb.v, &pb.dout, &pb.o});
    const std::vector<float> lse_before = pb.lse;
    pb.poison_backward_outputs();
    const Snaps g_snap = take({&pb.dq, &pb.dk, &pb.dv});
    st = run_backward(plan, pb);
    INFO("backward status " << ringattn_status_string(st) << ": " << ringattn_last_error());
    CK(st == RINGATTN_SUCCESS);
    if (st != RINGATTN_SUCCESS) return false;
    CK(padding_ok(g_snap));
    CK(whole_buffers_unchanged(in2));
    CK(bias_unchanged());
    CK(std::memcmp(lse_before.data(), pb.lse.data(), lse_before.size() * sizeof(float)) == 0);

    const bool dq_nf = pb.dq.any_nonfinite(), dk_nf = pb.dk.any_nonfinite(),
               dv_nf = pb.dv.any_nonfinite();
    CK(!dq_nf);
    CK(!dk_nf);
    CK(!dv_nf);
    const int64_t nonzero_empty_dq = nonzero_dq_rows(cfg, ref.lse, pb.dq);
    CK(nonzero_empty_dq == 0);
    got.dQ = pb.dq.to_dense();
    got.dK = pb.dk.to_dense();
    got.dV = pb.dv.to_dense();

    if (with_bias && pb.want_dbias) {
        const size_t n = pb.bias_elems();
        bool guard_ok = true, finite = true;
        for (size_t i = n; i < pb.dbias_buf.size(); ++i)
            guard_ok = guard_ok && pb.dbias_buf[i] == Problem::DBIAS_SENTINEL;
        for (size_t i = 0; i < n; ++i) finite = finite && std::isfinite(pb.dbias_buf[i]);
        CK(guard_ok);
        CK(finite);
        got.dBias = pb.dbias_dense();
        // Keys that no query keeps (every term of their sum is exactly 0): dBias exactly 0.
        const BwdResult gmag = oracle_backward_magnitude(cfg, Q, K, V, ref.O, ref.lse, dO);
        int64_t unseen_nonzero = 0;
        for (size_t i = 0; i < n; ++i)
            unseen_nonzero += gmag.dBias.v[i] == 0.0 && got.dBias.v[i] != 0.0;
        CK(unseen_nonzero == 0);
    }
    if (!pb.sinks_buf.empty()) {
        got.dSinks = Dense(1, cfg.H, 1);
        for (int h = 0; h < cfg.H; ++h) got.dSinks.v[(size_t)h] = pb.dsinks_buf[(size_t)h];
    }
    if (!spec9_check(cfg, Q, K, V, dO, got, judge)) ok = false;

    if (opt.check_determinism) {
        const auto a = view_bits(pb.dq), b = view_bits(pb.dk), c = view_bits(pb.dv);
        const std::vector<float> db = pb.dbias_buf;
        pb.poison_backward_outputs();
        CK(run_backward(plan, pb) == RINGATTN_SUCCESS);
        CK(view_bits(pb.dq) == a);
        CK(view_bits(pb.dk) == b);
        CK(view_bits(pb.dv) == c);
        CK(std::memcmp(db.data(), pb.dbias_buf.data(), db.size() * sizeof(float)) == 0);
    }
    return ok;
}

} // namespace ratest
