// Dynamic mask attention (SPEC 6; SPEC 10 cases 8 and 10): a per-key float32 bias [H_b, T_k]
// added to the logits (not scaled) and an optional top-k selection per query row over its whole
// sequence. Forward (O, LSE) and backward (dQ, dK, dV, dBias) of the public API against the
// float64 oracle under SPEC 9's tolerances, outputs poisoned with NaN before every call (see
// support/shim.cpp), plus direct checks of each clause of SPEC 10 case 10 that do not rely on the
// oracle's own selection, finite differences of dBias, empty rows, and the oracle's selection
// against a brute-force rank count.
#include <catch2/catch.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "support/shim.hpp"

using namespace ratest;

namespace {

const ringattn_dtype_t all_dtypes[] = {RINGATTN_FLOAT32, RINGATTN_FLOAT16, RINGATTN_BFLOAT16};
const float NINF = -std::numeric_limits<float>::infinity();

int pick(std::mt19937_64 &rng, std::initializer_list<int> xs)
{
    return *(xs.begin() + (ptrdiff_t)(rng() % xs.size()));
}

void require_plan(const Plan &p)
{
    INFO("plan_create: " << ringattn_last_error());
    REQUIRE(p.ok());
}

// Ragged lengths: mostly random in [2, maxlen], with 0 and 1 mixed in.
std::vector<int> ragged(std::mt19937_64 &rng, int nseq, int maxlen)
{
    std::vector<int> l;
    for (int i = 0; i < nseq; ++i) {
        const int r = (int)(rng() % 8);
        l.push_back(r == 0 ? 0 : r == 1 ? 1 : 2 + (int)(rng() % (uint64_t)(maxlen - 1)));
    }
    return l;
}

enum class Mask { None, Causal, Window, CausalWindow };
const Mask all_masks[] = {Mask::None, Mask::Causal, Mask::Window, Mask::CausalWindow};

void set_mask(AttnConfig &c, Mask m, std::mt19937_64 &rng)
{
    c.causal = false;
    c.wl = c.wr = -1;
    switch (m) {
    case Mask::None: break;
    case Mask::Causal: c.causal = true; break;
    case Mask::Window: // two-sided, sometimes one side unbounded
        c.wl = pick(rng, {-1, 0, 3, 17, 40});
        c.wr = pick(rng, {0, 2, 9, 33});
        break;
    case Mask::CausalWindow:
        c.causal = true;
        c.wl = pick(rng, {0, 1, 9, 31});
        break;
    }
}

// H_b for choice 0, 1, 2: 1, H_kv, H.
int bias_heads(const AttnConfig &c, int choice) { return choice == 0 ? 1 : choice == 1 ? c.hkv() : c.H; }

// keep_k for choice 0..4: none, 1, small (3), moderate (a fraction of the longest key sequence),
// more than T_k.
int keep_choice(const AttnConfig &c, int choice, std::mt19937_64 &rng)
{
    int maxlk = 1;
    for (size_t s = 0; s + 1 < c.cuk().size(); ++s) maxlk = std::max(maxlk, c.cuk()[s + 1] - c.cuk()[s]);
    switch (choice) {
    case 0: return 0;
    case 1: return 1;
    case 2: return 3;
    case 3: return 5 + (int)(rng() % (uint64_t)std::max(1, maxlk / 2));
    default: return rng() % 2 ? (int)c.Tk() + 1 + (int)(rng() % 5) : INT_MAX;
    }
}

// Biases rounded to multiples of 1/2: many exact ties, so the tie rule (lower position wins) is
// exercised in every kept/not-kept boundary that falls on a tie.
std::vector<double> quantized(const std::vector<double> &b)
{
    std::vector<double> q(b);
    for (double &x : q) x = std::round(2 * x) / 2;
    return q;
}

// Random problem with a bias; `it` cycles H_b, keep_k and the mask so that every combination
// shows up in a few dozen cases. Some sequence has at least 3 KV blocks of block_k keys.
AttnConfig random_dyn_config(std::mt19937_64 &rng, ringattn_dtype_t dt, int maxlen, int it)
{
    AttnConfig c;
    c.dtype = dt;
    const int G = pick(rng, {1, 2, 4});
    c.Hkv = pick(rng, {1, 2});
    c.H = G * c.Hkv;
    c.D = pick(rng, {16, 32, 64});
    c.Dv = rng() % 3 == 0 ? pick(rng, {8, 24, 48}) : 0;
    c.block_q = pick(rng, {1, 7, 16, 64, 0});
    c.block_k = pick(rng, {1, 7, 16, 64, 0});
    if (c.block_q == 1 && c.block_k == 1) c.block_k = 7; // keep the 1x1 tiling cheap
    const int nseq = 1 + (int)(rng() % 3);
    std::vector<int> lq = ragged(rng, nseq, maxlen);
    if (c.block_k > 0) lq[0] = std::max(lq[0], 3 * c.block_k + 25 + (int)(rng() % 20));
    c.cu_q = cu_from_lengths(lq);
    const int kmode = (int)(rng() % 4);
    if (kmode == 1 || kmode == 2) { // KV cache (more keys) or fewer keys than queries
        std::vector<int> lk;
        for (int l : lq) lk.push_back(kmode == 1 ? l + (int)(rng() % 60) : std::max(0, l - (int)(rng() % 20)));
        c.cu_k = cu_from_lengths(lk);
    }
    set_mask(c, all_masks[(size_t)(it % 4)], rng);
    if (rng() % 2) c.softcap = (float)pick(rng, {5, 30});
    if (rng() % 4 == 0) c.alibi = alibi_slopes(c.H);
    if (rng() % 3 == 0) c.scale = (float)(pick(rng, {3, 7, 13}) / 10.0);
    c.key_bias_heads = bias_heads(c, it % 3);
    c.keep_k = keep_choice(c, (it / 3) % 5, rng);
    c.num_threads = pick(rng, {1, 2});
    return c;
}

struct CaseOpts {
    Storage st = Storage::Packed;
    double sigma_qk = 1.0, sigma_bias = 1.0;
    bool quantize = false, determinism = false, want_dbias = true;
};

bool run_case(const AttnConfig &c, std::mt19937_64 &rng, const CaseOpts &o = CaseOpts())
{
    Problem pb(c, o.st, rng, o.sigma_qk, o.sigma_bias);
    if (o.quantize) pb.set_bias(quantized(pb.cfg.bias));
    pb.want_dbias = o.want_dbias;
    Plan plan(c);
    INFO("config: " << c.describe() << " storage=" << (int)o.st << " quantized=" << o.quantize);
    require_plan(plan);
    CheckOptions opt;
    opt.check_determinism = o.determinism;
    return check_against_oracle(plan, pb, opt);
}

Storage random_storage(std::mt19937_64 &rng, const AttnConfig &c)
{
    Storage st = (Storage)(rng() % 4);
    if (st == Storage::Interleaved && !c.cu_k.empty()) st = Storage::Padded;
    return st;
}

// Bitwise copies of every output.
struct Outputs {
    std::vector<unsigned char> o, dq, dk, dv;
    std::vector<float> lse, dbias;
    explicit Outputs(const Problem &pb)
        : o(pb.o.buf->bytes), dq(pb.dq.buf->bytes), dk(pb.dk.buf->bytes), dv(pb.dv.buf->bytes),
          lse(pb.lse), dbias(pb.dbias_buf)
    {
    }
};

bool same_floats(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void run_both(const Plan &plan, Problem &pb)
{
    pb.poison_forward_outputs();
    pb.poison_backward_outputs();
    INFO("config: " << pb.cfg.describe());
    {
        const ringattn_status_t st = run_forward(plan, pb);
        INFO("forward: " << ringattn_last_error());
        REQUIRE(st == RINGATTN_SUCCESS);
    }
    const ringattn_status_t st = run_backward(plan, pb);
    INFO("backward: " << ringattn_last_error());
    REQUIRE(st == RINGATTN_SUCCESS);
}

double lse_at(const Problem &pb, int h, int64_t t) { return pb.lse[(size_t)(h * pb.cfg.Tq() + t)]; }

} // namespace

// ------------------------------------------------------------------------------------------
// 1. Random cases against the float64 oracle.

TEST_CASE("dynamic mask: random shapes, masks, bias heads and keep_k, float32", "[dynamic][fwd][bwd]")
{
    for (int it = 0; it < 60; ++it) {
        std::mt19937_64 rng(seed_for("dyn-random-f32", (uint64_t)it));
        const AttnConfig c = random_dyn_config(rng, RINGATTN_FLOAT32, 90, it);
        CaseOpts o;
        o.st = random_storage(rng, c);
        o.sigma_qk = c.softcap > 0 ? 2.5 : 1.0;
        o.sigma_bias = pick(rng, {1, 1, 3});
        o.quantize = rng() % 3 == 0;
        run_case(c, rng, o);
    }
}

TEST_CASE("dynamic mask: random shapes, float16 and bfloat16", "[dynamic][fwd][bwd][half]")
{
    for (int it = 0; it < 40; ++it) {
        std::mt19937_64 rng(seed_for("dyn-random-half", (uint64_t)it));
        const AttnConfig c = random_dyn_config(rng, it % 2 ? RINGATTN_BFLOAT16 : RINGATTN_FLOAT16, 80, it);
        CaseOpts o;
        o.st = random_storage(rng, c);
        o.sigma_qk = c.softcap > 0 ? 2.5 : 1.0;
        o.quantize = it % 4 == 1;
        run_case(c, rng, o);
    }
}

TEST_CASE("dynamic mask: every H_b, GQA ratio, keep_k and mask", "[dynamic][fwd][bwd]")
{
    // H_kv = 2 and G = 1, 2, 4: H_b = 1, H_kv and H are three different mappings whenever G > 1.
    // Tiles of 1, 7 and 24 keys over a 70-key sequence: at least 3 KV blocks, and the bias must
    // be applied in every one of them.
    int idx = 0;
    for (int G : {1, 2, 4})
        for (int hb = 0; hb < 3; ++hb)
            for (int kc = 0; kc < 5; ++kc)
                for (Mask m : all_masks) {
                    std::mt19937_64 rng(seed_for("dyn-grid", (uint64_t)idx));
                    AttnConfig c;
                    c.Hkv = 2;
                    c.H = 2 * G;
                    c.D = 16;
                    c.Dv = 12;
                    c.cu_q = cu_from_lengths({70, 0, 1, 45});
                    set_mask(c, m, rng);
                    c.key_bias_heads = bias_heads(c, hb);
                    c.keep_k = kc == 3 ? 12 : keep_choice(c, kc, rng);
                    const int blocks[][2] = {{7, 24}, {24, 7}, {16, 1}, {1, 7}, {0, 24}};
                    c.block_q = blocks[idx % 5][0];
                    c.block_k = blocks[idx % 5][1];
                    c.num_threads = 1 + idx % 2;
                    CaseOpts o;
                    o.quantize = (idx + idx / 4) % 3 == 2; // every keep_k, mask and H_b
                    run_case(c, rng, o);
                    ++idx;
                }
}

TEST_CASE("dynamic mask: every dtype with every mask, softcap and ALiBi on and off", "[dynamic][fwd][bwd][half]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (Mask m : all_masks)
            for (int opt = 0; opt < 2; ++opt) {
                std::mt19937_64 rng(seed_for("dyn-dtype-mask", (uint64_t)idx));
                AttnConfig c;
                c.dtype = dt;
                c.H = 4;
                c.Hkv = 2;
                c.D = 32;
                c.Dv = 24;
                c.cu_q = cu_from_lengths({1 + (int)(rng() % 90), 0, 1, 60 + (int)(rng() % 100)});
                c.cu_k = cu_from_lengths({c.cu_q[1] + 17, 4, 1, c.cu_q[4] - c.cu_q[3]});
                set_mask(c, m, rng);
                if (opt) {
                    c.softcap = 5.0f;
                    c.alibi = alibi_slopes(c.H);
                }
                c.block_q = 32;
                c.block_k = 16;
                c.key_bias_heads = bias_heads(c, idx % 3);
                c.keep_k = keep_choice(c, idx % 5, rng);
                CaseOpts o;
                o.sigma_qk = opt ? 3.0 : 1.0;
                run_case(c, rng, o);
                ++idx;
            }
}

TEST_CASE("dynamic mask: tile sizes 1, 7 and 64 with at least 3 KV blocks", "[dynamic][fwd][bwd][blocks]")
{
    int idx = 0;
    for (int bq : {1, 7, 64})
        for (int bk : {1, 7, 64}) {
            if (bq == 1 && bk == 1) continue;
            std::mt19937_64 rng(seed_for("dyn-blocks", (uint64_t)idx));
            AttnConfig c;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = cu_from_lengths({200 + (int)(rng() % 60), 1, (int)(rng() % 70)});
            set_mask(c, all_masks[idx % 4], rng);
            c.block_q = bq;
            c.block_k = bk;
            c.key_bias_heads = idx % 2 ? 2 : 1;
            c.keep_k = keep_choice(c, idx % 5, rng);
            run_case(c, rng);
            ++idx;
        }
}

TEST_CASE("dynamic mask: dBias not requested, strides, threads and repeatability", "[dynamic][fwd][bwd]")
{
    for (int it = 0; it < 8; ++it) {
        std::mt19937_64 rng(seed_for("dyn-misc", (uint64_t)it));
        AttnConfig c = random_dyn_config(rng, all_dtypes[it % 3], 80, it);
        c.num_threads = 2;
        CaseOpts o;
        o.st = (Storage)(it % 3 + 1); // PackedZero, Padded, Interleaved
        if (o.st == Storage::Interleaved && !c.cu_k.empty()) o.st = Storage::Padded;
        o.want_dbias = it % 2 == 0; // dbias = NULL: dQ, dK, dV still right
        o.determinism = true;
        run_case(c, rng, o);
    }
}

TEST_CASE("dynamic mask: top-k under sliding windows with heavy ties, long sequences", "[dynamic][fwd][bwd]")
{
    // Each row's valid set slides along the sequence, and the biases take 3 or 4 distinct values:
    // the keep_k-th largest is nearly always a tie, decided by position, and changes from row
    // to row. Lengths beyond the default tile; one variant with more keys than queries.
    struct W {
        bool causal;
        int wl, wr;
    };
    const W windows[] = {{true, 100, -1}, {false, 50, 20}, {false, -1, 10}, {false, -1, -1}};
    int idx = 0;
    for (const W &w : windows)
        for (int keep : {1, 2, 17, 64, 150}) {
            std::mt19937_64 rng(seed_for("dyn-ties-long", (uint64_t)idx));
            AttnConfig c;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = cu_from_lengths({500, 37});
            if (idx % 5 == 4) c.cu_k = cu_from_lengths({530, 90});
            c.causal = w.causal;
            c.wl = w.wl;
            c.wr = w.wr;
            c.block_q = idx % 2 ? 0 : 32;
            c.block_k = idx % 2 ? 0 : 7;
            c.num_threads = 2;
            c.key_bias_heads = idx % 2 ? 2 : 1;
            c.keep_k = keep;
            Problem pb(c, Storage::Packed, rng);
            const int levels = 3 + idx % 2;
            std::vector<double> b = pb.cfg.bias;
            for (double &x : b) x = (double)(rng() % (uint64_t)levels) - 1.0;
            pb.set_bias(b);
            Plan plan(c);
            require_plan(plan);
            INFO("config: " << c.describe());
            check_against_oracle(plan, pb);
            ++idx;
        }
}

// ------------------------------------------------------------------------------------------
// 2. SPEC 10 case 10, clause by clause, checked directly (not through the oracle's selection).

TEST_CASE("SPEC 10 case 10: a bias shifts the logit by exactly itself at any scale", "[dynamic][spec][case10]")
{
    for (float scale : {10.0f, 0.01f, 0.0f}) {
        INFO("softmax_scale " << scale);
        std::mt19937_64 rng(seed_for("case10-scale", (uint64_t)(scale * 1000)));
        // (1) Window (0, 0): every row has one key, so LSE = z_ii + b_i exactly: the run with
        //     a bias minus the run without must be b_i (not scale * b_i), and O = v_i in both.
        {
            AttnConfig c;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.cu_q = {0, 40, 63};
            c.wl = c.wr = 0;
            c.scale = scale;
            Problem pb(c, Storage::Packed, rng, 0.3);
            AttnConfig cb = c;
            cb.key_bias_heads = 1;
            std::vector<double> b((size_t)c.Tk());
            for (size_t j = 0; j < b.size(); ++j) b[j] = -4.0 + 0.25 * (double)(j % 33);
            Plan p0(c), pbias(cb);
            require_plan(p0);
            require_plan(pbias);
            pb.poison_forward_outputs();
            REQUIRE(run_forward(p0, pb) == RINGATTN_SUCCESS);
            const std::vector<float> lse0 = pb.lse;
            pb.cfg = cb;
            pb.set_bias(b);
            pb.poison_forward_outputs();
            REQUIRE(run_forward(pbias, pb) == RINGATTN_SUCCESS);
            int64_t bad_lse = 0, bad_o = 0;
            for (int h = 0; h < c.H; ++h)
                for (int64_t t = 0; t < c.Tq(); ++t) {
                    const double shift = (double)lse_at(pb, h, t) - (double)lse0[(size_t)(h * c.Tq() + t)];
                    bad_lse += !(std::fabs(shift - b[(size_t)t]) <= 1e-5 * std::max(1.0, std::fabs((double)lse_at(pb, h, t))));
                    for (int cc = 0; cc < c.dv(); ++cc) bad_o += pb.o.bits(t, h, cc) != pb.v.bits(t, 0, cc);
                }
            CHECK(bad_lse == 0);
            CHECK(bad_o == 0);
        }
        // (2) Two keys, bias c on key 1 only: with V = (0, 1) (D_v = 1) the output is
        //     P_1 = sigmoid(s_1 - s_0), so logit(O) recovers s_1 - s_0; with the bias it must
        //     grow by exactly c.
        {
            AttnConfig c;
            c.H = 1;
            c.D = 4;
            c.Dv = 1;
            c.cu_q = {0, 2};
            c.scale = scale;
            Problem pb(c, Storage::Packed, rng, scale > 1 ? 0.1 : 1.0);
            pb.v.set(0, 0, 0, 0.0);
            pb.v.set(1, 0, 0, 1.0);
            AttnConfig cb = c;
            cb.key_bias_heads = 1;
            const double cbias = 1.5;
            Plan p0(c), pbias(cb);
            require_plan(p0);
            require_plan(pbias);
            pb.poison_forward_outputs();
            REQUIRE(run_forward(p0, pb) == RINGATTN_SUCCESS);
            const double o0[2] = {pb.o.get(0, 0, 0), pb.o.get(1, 0, 0)};
            pb.cfg = cb;
            pb.set_bias({0.0, cbias});
            pb.poison_forward_outputs();
            REQUIRE(run_forward(pbias, pb) == RINGATTN_SUCCESS);
            for (int t = 0; t < 2; ++t) {
                const double o1 = pb.o.get(t, 0, 0);
                REQUIRE(o0[t] > 0.01);
                REQUIRE(o0[t] < 0.99);
                const double d = std::log(o1 / (1 - o1)) - std::log(o0[t] / (1 - o0[t]));
                INFO("row " << t << ": logit shift " << d << ", bias " << cbias);
                CHECK(std::fabs(d - cbias) <= 1e-4);
            }
        }
        // (3) The same constant bias c on every key: O unchanged, LSE + c.
        {
            AttnConfig c;
            c.H = 4;
            c.Hkv = 2;
            c.D = 32;
            c.cu_q = {0, 90, 130};
            c.causal = true;
            c.scale = scale;
            c.block_k = 16;
            Problem pb(c, Storage::Packed, rng, 0.5);
            Plan p0(c);
            require_plan(p0);
            pb.poison_forward_outputs();
            REQUIRE(run_forward(p0, pb) == RINGATTN_SUCCESS);
            const Dense O0 = pb.o.to_dense();
            const std::vector<float> lse0 = pb.lse;
            for (int hb : {1, 2, 4}) {
                AttnConfig cb = c;
                cb.key_bias_heads = hb;
                pb.cfg = cb;
                pb.set_bias(std::vector<double>((size_t)(hb * c.Tk()), 3.25));
                Plan pbias(cb);
                require_plan(pbias);
                pb.poison_forward_outputs();
                REQUIRE(run_forward(pbias, pb) == RINGATTN_SUCCESS);
                INFO("H_b " << hb);
                CHECK(max_rel_err(pb.o.to_dense(), O0) <= 1e-5);
                int64_t bad = 0;
                for (size_t i = 0; i < lse0.size(); ++i)
                    bad += !(std::fabs((double)pb.lse[i] - lse0[i] - 3.25) <= 1e-5 * std::max(1.0, std::fabs((double)lse0[i])));
                CHECK(bad == 0);
            }
        }
        // (4) Random biases against the oracle at this scale, forward and backward.
        for (int hb = 0; hb < 3; ++hb) {
            AttnConfig c;
            c.H = 4;
            c.Hkv = 2;
            c.D = 24;
            c.cu_q = cu_from_lengths({80, 33});
            c.causal = hb != 1;
            c.scale = scale;
            c.block_k = 16;
            c.key_bias_heads = bias_heads(c, hb);
            c.keep_k = hb == 2 ? 7 : 0;
            CaseOpts o;
            o.sigma_qk = scale > 1 ? 0.3 : 1.0;
            run_case(c, rng, o);
        }
    }
}

TEST_CASE("SPEC 10 case 10: the bias is applied in every KV block", "[dynamic][spec][case10]")
{
    // One sequence of 200 keys, scale 0.01 (logits ~ 0), bias 0 except +40 on one key j* in the
    // first, second, third or last KV block: every row's output is v_j* (the other 199 keys
    // weigh ~ 200 e^-40 ~ 1e-15). Then keep_k = 1 with bias -40 everywhere but j*: O = v_j*
    // exactly.
    int idx = 0;
    for (int bk : {1, 7, 64})
        for (int which = 0; which < 4; ++which) {
            const int L = 200;
            const int js = which == 3 ? L - 1 : which * bk + (bk > 1 ? 1 + which : 0);
            std::mt19937_64 rng(seed_for("case10-blocks", (uint64_t)idx++));
            AttnConfig c;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = {0, L};
            c.scale = 0.01f;
            c.block_q = bk == 1 ? 7 : bk;
            c.block_k = bk;
            c.key_bias_heads = 1;
            Problem pb(c, Storage::Packed, rng);
            std::vector<double> b((size_t)L, 0.0);
            b[(size_t)js] = 40.0;
            pb.set_bias(b);
            Plan plan(c);
            require_plan(plan);
            INFO("block_k " << bk << ", j* = " << js);
            REQUIRE(check_against_oracle(plan, pb));
            double vmax = 0, err = 0;
            for (int cc = 0; cc < c.Dv; ++cc) vmax = std::max(vmax, std::fabs(pb.v.get(js, 0, cc)));
            for (int64_t t = 0; t < L; ++t)
                for (int h = 0; h < c.H; ++h)
                    for (int cc = 0; cc < c.Dv; ++cc)
                        err = std::max(err, std::fabs(pb.o.get(t, h, cc) - pb.v.get(js, 0, cc)));
            CHECK(err <= 1e-5 * vmax);

            AttnConfig c1 = c;
            c1.keep_k = 1;
            pb.cfg = c1;
            std::vector<double> b1((size_t)L, -40.0);
            b1[(size_t)js] = 0.0;
            pb.set_bias(b1);
            Plan plan1(c1);
            require_plan(plan1);
            REQUIRE(check_against_oracle(plan1, pb));
            int64_t bad = 0;
            for (int64_t t = 0; t < L; ++t)
                for (int h = 0; h < c.H; ++h)
                    for (int cc = 0; cc < c.Dv; ++cc) bad += pb.o.bits(t, h, cc) != pb.v.bits(js, 0, cc);
            CHECK(bad == 0);
        }
}

TEST_CASE("SPEC 10 case 10: keep_k >= T_k is no selection, bitwise", "[dynamic][spec][case10]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16})
        for (Mask m : all_masks)
            for (int hb = 0; hb < 3; ++hb) {
                std::mt19937_64 rng(seed_for("case10-keepall", (uint64_t)idx++));
                AttnConfig c;
                c.dtype = dt;
                c.H = 4;
                c.Hkv = 2;
                c.D = 16;
                c.Dv = 16;
                c.cu_q = idx % 2 ? std::vector<int32_t>{0, 150} : cu_from_lengths({60, 1, 0, 77});
                set_mask(c, m, rng);
                c.block_q = 16;
                c.block_k = 24;
                c.key_bias_heads = bias_heads(c, hb);
                Problem pb(c, Storage::Packed, rng);
                if (idx % 3 == 0) pb.set_bias(quantized(pb.cfg.bias));
                Plan p0(c);
                require_plan(p0);
                REQUIRE(check_against_oracle(p0, pb));
                const Outputs ref(pb);
                for (int kk : {(int)c.Tk(), (int)c.Tk() + 1, INT_MAX}) {
                    AttnConfig ck = c;
                    ck.keep_k = kk;
                    Plan pk(ck);
                    require_plan(pk);
                    run_both(pk, pb);
                    const Outputs got(pb);
                    INFO("keep_k " << kk << " config " << ck.describe());
                    CHECK(got.o == ref.o);
                    CHECK(same_floats(got.lse, ref.lse));
                    CHECK(got.dq == ref.dq);
                    CHECK(got.dk == ref.dk);
                    CHECK(got.dv == ref.dv);
                    CHECK(same_floats(got.dbias, ref.dbias));
                }
            }
}

TEST_CASE("SPEC 10 case 10: a causal row with fewer valid keys than keep_k keeps only valid keys", "[dynamic][spec][case10]")
{
    // bias[j] = 10 j: every future key outranks every valid one. keep_k = 8: rows at positions
    // p < 8 have p + 1 valid keys and keep them all; row p >= 8 keeps keys p-7..p. A future key
    // leaking into the selection would dominate the softmax (bias +10 per position).
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int variant = 0; variant < 3; ++variant) {
            std::mt19937_64 rng(seed_for("case10-fewer", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = {0, 64, 94};
            if (variant == 2) c.cu_k = {0, 80, 100}; // KV cache: query p sees keys <= p + delta
            c.causal = true;
            if (variant == 1) c.wl = 3; // <= 4 valid keys per row: keep_k = 8 keeps all of them
            c.block_q = 16;
            c.block_k = 8;
            c.key_bias_heads = 1;
            c.keep_k = 8;
            Problem pb(c, Storage::Packed, rng);
            std::vector<double> b((size_t)c.Tk());
            for (size_t s = 0; s + 1 < c.cuk().size(); ++s)
                for (int32_t j = c.cuk()[s]; j < c.cuk()[s + 1]; ++j) b[(size_t)j] = 10.0 * (j - c.cuk()[s]);
            pb.set_bias(b);
            Plan plan(c);
            require_plan(plan);
            INFO("variant " << variant << " " << c.describe());
            REQUIRE(check_against_oracle(plan, pb));
            // Row 0 of each sequence without extra keys has the single valid key 0: O = v_0
            // bitwise.
            if (variant != 2)
                for (int64_t t0 : {(int64_t)0, (int64_t)64}) {
                    int64_t bad = 0;
                    for (int h = 0; h < c.H; ++h)
                        for (int cc = 0; cc < c.Dv; ++cc) bad += pb.o.bits(t0, h, cc) != pb.v.bits(t0, 0, cc);
                    CHECK(bad == 0);
                }
            // Against the plan without selection (bias only) on the rows where the selection
            // keeps every valid key: rows p < 8 (and every row with window 3).
            const Dense Osel = pb.o.to_dense();
            const std::vector<float> lse_sel = pb.lse;
            AttnConfig c0 = c;
            c0.keep_k = 0;
            Plan plan0(c0);
            require_plan(plan0);
            pb.poison_forward_outputs();
            REQUIRE(run_forward(plan0, pb) == RINGATTN_SUCCESS); // same inputs, bias only
            double err = 0, den = 0;
            int64_t bad_lse = 0;
            for (size_t s = 0; s + 1 < c.cu_q.size(); ++s)
                for (int32_t t = c.cu_q[s]; t < c.cu_q[s + 1]; ++t) {
                    const int64_t delta = (c.cuk()[s + 1] - c.cuk()[s]) - (c.cu_q[s + 1] - c.cu_q[s]);
                    const int64_t nvalid = std::min<int64_t>(t - c.cu_q[s] + delta + 1, c.wl >= 0 ? c.wl + 1 : INT_MAX);
                    if (nvalid > 8) continue;
                    for (int h = 0; h < c.H; ++h) {
                        for (int cc = 0; cc < c.Dv; ++cc) {
                            err = std::max(err, std::fabs(Osel.at(t, h, cc) - pb.o.get(t, h, cc)));
                            den = std::max(den, std::fabs(pb.o.get(t, h, cc)));
                        }
                        const double l0 = lse_at(pb, h, t), l1 = lse_sel[(size_t)(h * c.Tq() + t)];
                        bad_lse += !(l0 == l1 || std::fabs(l1 - l0) <= 1e-5 * std::max(1.0, std::fabs(l0)));
                    }
                }
            CHECK(bad_lse == 0);
            CHECK(err <= (dt == RINGATTN_FLOAT32 ? 1e-5 : 1e-2) * den);
        }
}

TEST_CASE("SPEC 10 case 10: ties go to the lower position", "[dynamic][spec][case10]")
{
    // Reference without the oracle's selection: the oracle with the bias but keep_k = 0,
    // restricted to the keys the tie rule picks (a KeyFilter), which is the same for every row.
    struct TieCase {
        const char *what;
        std::vector<double> bias; // first keys; the rest get `rest`
        double rest;
        int keep_k;
        std::vector<int> kept;
        bool causal;
    };
    const TieCase cases[] = {
        {"all equal, keep 3", {}, 0.5, 3, {0, 1, 2}, false},
        {"all equal, keep 3, causal", {}, 0.5, 3, {0, 1, 2}, true},
        {"all equal, keep 1", {}, -2.0, 1, {0}, false},
        {"one above, ties at the boundary", {1, 5, 3, 3, 3, 3, 0}, -1.0, 3, {1, 2, 3}, false},
        {"ties at the boundary, causal", {1, 5, 3, 3, 3, 3, 0}, -1.0, 3, {1, 2, 3}, true},
        {"later ties lose to earlier ones", {0, 0, 2, 0, 2, 0, 2, 2}, 2.0, 4, {2, 4, 6, 7}, false},
        // -0.0 == +0.0: a tie (an order on the bit patterns would put +0.0 first)
        {"signed zeros tie", {-0.0, 0.0, -0.0, 0.0, 0.0, -0.0}, 0.0, 3, {0, 1, 2}, false},
        {"signed zeros tie, causal", {-0.0, -0.0, 0.0, -0.0, 0.0}, -0.0, 2, {0, 1}, true},
    };
    int idx = 0;
    for (const TieCase &tc : cases)
        for (int bk : {1, 16}) {
            std::mt19937_64 rng(seed_for("case10-ties", (uint64_t)idx++));
            AttnConfig c;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = {0, 50};
            c.causal = tc.causal;
            c.block_q = 8;
            c.block_k = bk;
            c.key_bias_heads = 1;
            c.keep_k = tc.keep_k;
            std::vector<double> b(50, tc.rest);
            for (size_t j = 0; j < tc.bias.size(); ++j) b[j] = tc.bias[j];
            c.bias = b;
            Problem pb(c, Storage::Packed, rng);
            Plan plan(c);
            require_plan(plan);
            INFO(tc.what << ", block_k " << bk);
            REQUIRE(check_against_oracle(plan, pb));
            // Rows that see every kept key (all rows without causal; rows p >= max kept with
            // causal) equal the filtered reference.
            AttnConfig c0 = c;
            c0.keep_k = 0;
            KeyFilter f(50, 0);
            for (int j : tc.kept) f[(size_t)j] = 1;
            const FwdResult ref = oracle_forward(c0, pb.q.to_dense(), pb.k.to_dense(), pb.v.to_dense(), &f);
            const int first = tc.causal ? *std::max_element(tc.kept.begin(), tc.kept.end()) : 0;
            double err = 0, den = 0, lerr = 0;
            for (int64_t t = first; t < 50; ++t)
                for (int h = 0; h < c.H; ++h) {
                    for (int cc = 0; cc < c.Dv; ++cc) {
                        err = std::max(err, std::fabs(pb.o.get(t, h, cc) - ref.O.at(t, h, cc)));
                        den = std::max(den, std::fabs(ref.O.at(t, h, cc)));
                    }
                    const double r = ref.lse[(size_t)(h * 50 + t)];
                    lerr = std::max(lerr, std::fabs(lse_at(pb, h, t) - r) / std::max(1.0, std::fabs(r)));
                }
            CHECK(err <= 1e-5 * den);
            CHECK(lerr <= 1e-5);
            // and the oracle's own selection agrees with the hand-written one
            for (int64_t t = first; t < 50; t += 7) {
                const std::vector<int64_t> kept = oracle_kept_keys(c, t, 0);
                CHECK(kept == std::vector<int64_t>(tc.kept.begin(), tc.kept.end()));
            }
        }
}

// ------------------------------------------------------------------------------------------
// 3. Finite differences (SPEC 10 case 8 for dBias).

namespace {

Dense random_dense(std::mt19937_64 &rng, int64_t T, int H, int D, double sigma)
{
    Dense d(T, H, D);
    std::normal_distribution<double> nd(0.0, sigma);
    for (double &x : d.v) x = nd(rng);
    return d;
}

double loss(const AttnConfig &c, const Dense &Q, const Dense &K, const Dense &V, const Dense &G)
{
    const FwdResult r = oracle_forward(c, Q, K, V);
    double L = 0;
    for (size_t i = 0; i < G.v.size(); ++i) L += r.O.v[i] * G.v[i];
    return L;
}

const double FD_H = 1e-5;

Dense numeric_grad(const AttnConfig &c, Dense &Q, Dense &K, Dense &V, const Dense &G, Dense &x)
{
    Dense g(x.T, x.heads, x.dim);
    for (size_t i = 0; i < x.v.size(); ++i) {
        const double x0 = x.v[i];
        x.v[i] = x0 + FD_H;
        const double lp = loss(c, Q, K, V, G);
        x.v[i] = x0 - FD_H;
        const double lm = loss(c, Q, K, V, G);
        x.v[i] = x0;
        g.v[i] = (lp - lm) / (2 * FD_H);
    }
    return g;
}

Dense numeric_dbias(AttnConfig c, const Dense &Q, const Dense &K, const Dense &V, const Dense &G)
{
    Dense g(c.key_bias_heads, 1, c.Tk());
    for (size_t i = 0; i < c.bias.size(); ++i) {
        const double b0 = c.bias[i];
        c.bias[i] = b0 + FD_H;
        const double lp = loss(c, Q, K, V, G);
        c.bias[i] = b0 - FD_H;
        const double lm = loss(c, Q, K, V, G);
        c.bias[i] = b0;
        g.v[i] = (lp - lm) / (2 * FD_H);
    }
    return g;
}

// Biases 0.37 apart per head (a shuffled ladder plus a little noise): no perturbation of 1e-5
// changes the selection, which is not differentiated (SPEC 6).
std::vector<double> ladder_bias(std::mt19937_64 &rng, int Hb, int64_t Tk)
{
    std::vector<double> b;
    std::uniform_real_distribution<double> u(-0.05, 0.05);
    for (int h = 0; h < Hb; ++h) {
        std::vector<double> l((size_t)Tk);
        for (int64_t j = 0; j < Tk; ++j) l[(size_t)j] = 0.37 * (double)j - 2.0 + u(rng);
        std::shuffle(l.begin(), l.end(), rng);
        b.insert(b.end(), l.begin(), l.end());
    }
    return b;
}

struct FdCase {
    const char *name;
    bool causal;
    int wl, wr;
    float softcap;
    bool alibi;
    float scale;
    int H, Hkv, Hb, keep_k;
};

const FdCase fd_cases[] = {
    {"plain, H_b = H", false, -1, -1, 0.0f, false, 0.0f, 2, 2, 2, 0},
    {"softcap, H_b = 1", false, -1, -1, 1.5f, false, 0.0f, 2, 2, 1, 0},
    {"top-3, no mask", false, -1, -1, 0.0f, false, 0.0f, 2, 1, 1, 3},
    {"causal+window, GQA, H_b = H_kv, top-3", true, 3, -1, 0.0f, false, 0.0f, 4, 2, 2, 3},
    {"causal, GQA, softcap, H_b = H, top-2", true, -1, -1, 2.0f, false, 0.0f, 4, 2, 4, 2},
    {"two-sided window, MQA, softcap, ALiBi, scale, H_b = 1, top-2", false, 2, 1, 3.0f, true, 0.7f, 4, 1, 1, 2},
};

AttnConfig fd_config(const FdCase &fc, int D, int Dv, std::vector<int> lq, std::vector<int> lk)
{
    AttnConfig c;
    c.H = fc.H;
    c.Hkv = fc.Hkv;
    c.D = D;
    c.Dv = Dv;
    c.cu_q = cu_from_lengths(lq);
    c.cu_k = cu_from_lengths(lk);
    c.causal = fc.causal;
    c.wl = fc.wl;
    c.wr = fc.wr;
    c.softcap = fc.softcap;
    if (fc.alibi) c.alibi = alibi_slopes(c.H);
    c.scale = fc.scale;
    c.key_bias_heads = fc.Hb;
    c.keep_k = fc.keep_k;
    return c;
}

} // namespace

TEST_CASE("the float64 oracle's dBias and dQ with a bias match central differences", "[dynamic][fd][oracle]")
{
    int idx = 0;
    for (const FdCase &fc : fd_cases) {
        std::mt19937_64 rng(seed_for("dyn-fd-oracle", (uint64_t)idx++));
        // Sequence 1 has fewer keys than queries (empty rows under causal masks).
        AttnConfig c = fd_config(fc, 6, 5, {7, 6, 1}, {7, 3, 2});
        c.bias = ladder_bias(rng, c.key_bias_heads, c.Tk());
        const double sigma = fc.softcap > 0 ? 2.0 : 1.0;
        Dense Q = random_dense(rng, c.Tq(), c.H, c.D, sigma), K = random_dense(rng, c.Tk(), c.hkv(), c.D, sigma),
              V = random_dense(rng, c.Tk(), c.hkv(), c.dv(), 1.0), G = random_dense(rng, c.Tq(), c.H, c.dv(), 1.0);
        const FwdResult f = oracle_forward(c, Q, K, V);
        const BwdResult b = oracle_backward(c, Q, K, V, f.O, f.lse, G);
        INFO(fc.name << ": " << c.describe());
        const Dense nb = numeric_dbias(c, Q, K, V, G);
        const Dense nq = numeric_grad(c, Q, K, V, G, Q);
        const Dense nk = numeric_grad(c, Q, K, V, G, K);
        const Dense nv = numeric_grad(c, Q, K, V, G, V);
        CHECK(norm_rel_err(b.dBias, nb) <= 1e-7);
        CHECK(max_rel_err(b.dBias, nb) <= 1e-7);
        CHECK(norm_rel_err(b.dQ, nq) <= 1e-7);
        CHECK(norm_rel_err(b.dK, nk) <= 1e-7);
        CHECK(norm_rel_err(b.dV, nv) <= 1e-7);
        // not vacuous: dBias is non-trivial, and with top-k some keys are dropped by some rows
        CHECK(norm_rel_err(Dense(nb.T, nb.heads, nb.dim), nb) == 1.0);
        CHECK(norm_rel_err(Dense(nq.T, nq.heads, nq.dim), nq) == 1.0);
        if (fc.keep_k > 0) {
            AttnConfig c0 = c;
            c0.keep_k = 0;
            CHECK(max_rel_err(oracle_forward(c0, Q, K, V).O, f.O) > 1e-3);
        }
    }
}

TEST_CASE("library float32 dBias matches the finite-difference-validated oracle", "[dynamic][fd][bwd]")
{
    int idx = 0;
    for (const FdCase &fc : fd_cases)
        for (int size = 0; size < 2; ++size) {
            std::mt19937_64 rng(seed_for("dyn-fd-library", (uint64_t)idx++));
            AttnConfig c = size == 0 ? fd_config(fc, 6, 5, {7, 6, 1}, {7, 3, 2})
                                     : fd_config(fc, 48, 40, {90, 60, 1}, {90, 30, 70});
            if (fc.keep_k > 0 && size == 1) c.keep_k = 4 * fc.keep_k;
            if (size == 1) c.block_q = 32, c.block_k = 16;
            c.bias = ladder_bias(rng, c.key_bias_heads, c.Tk());
            INFO(fc.name);
            Problem pb(c, Storage::Packed, rng, fc.softcap > 0 ? 2.0 : 1.0);
            Plan plan(c);
            require_plan(plan);
            check_against_oracle(plan, pb);
        }
}

// ------------------------------------------------------------------------------------------
// 4. Rows with no allowed key, keys no row sees, very negative biases.

TEST_CASE("dynamic mask: rows with no allowed key and keys no query keeps", "[dynamic][mask]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int variant = 0; variant < 4; ++variant) {
            std::mt19937_64 rng(seed_for("dyn-empty-rows", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 4;
            c.Hkv = 2;
            c.D = 32;
            c.Dv = 16;
            c.cu_q = cu_from_lengths({60, 40, 25, 0});
            c.cu_k = cu_from_lengths({30, 0, 25, 6}); // seq 3: 6 keys, no query
            c.block_q = 8;
            c.block_k = 8;
            switch (variant) {
            case 0: c.causal = true; break;                   // rows 0..29 of seq 0 empty
            case 1: c.wl = -1, c.wr = 3; break;               // rows with p - 30 + 3 < 0 empty
            case 2: c.causal = true, c.wl = 2; break;
            case 3: c.wl = 0, c.wr = 0, c.softcap = 4; break; // one key per row at most
            }
            c.key_bias_heads = bias_heads(c, idx % 3);
            c.keep_k = pick(rng, {0, 1, 3, 1000});
            Problem pb(c, Storage::Padded, rng);
            Plan plan(c);
            require_plan(plan);
            INFO("variant " << variant << " config: " << c.describe());
            // O = 0 and LSE = -inf exactly on empty rows, dQ = 0 there, no NaN, and dBias exactly
            // 0 for keys no query keeps (check_against_oracle).
            REQUIRE(check_against_oracle(plan, pb));
            int64_t empty = 0;
            for (float l : pb.lse) empty += l == NINF;
            CHECK(empty > 0);
            bool zero = true;
            for (int64_t j = c.Tk() - 6; j < c.Tk(); ++j) {
                for (int h = 0; h < c.hkv(); ++h) {
                    for (int cc = 0; cc < c.D; ++cc) zero = zero && pb.dk.get(j, h, cc) == 0.0;
                    for (int cc = 0; cc < c.Dv; ++cc) zero = zero && pb.dv.get(j, h, cc) == 0.0;
                }
                for (int hb = 0; hb < c.key_bias_heads; ++hb)
                    zero = zero && pb.dbias_buf[(size_t)(hb * c.Tk() + j)] == 0.0f;
            }
            CHECK(zero);
        }
}

TEST_CASE("dynamic mask: empty batches with a bias", "[dynamic][mask]")
{
    const std::vector<int32_t> cases[][2] = {
        {{0}, {}},
        {{0, 0, 0}, {}},
        {{0, 0, 0}, {0, 0, 5}},
        {{0, 0, 3}, {0, 4, 4}},
    };
    int idx = 0;
    for (auto &cu : cases)
        for (int keep : {0, 2}) {
            std::mt19937_64 rng(seed_for("dyn-empty", (uint64_t)idx++));
            AttnConfig c;
            c.H = 2;
            c.D = 8;
            c.cu_q = cu[0];
            c.cu_k = cu[1];
            c.causal = idx % 2;
            c.key_bias_heads = 2;
            c.keep_k = keep;
            Problem pb(c, Storage::Packed, rng);
            Plan plan(c);
            require_plan(plan);
            INFO("config: " << c.describe());
            REQUIRE(check_against_oracle(plan, pb));
            bool zero = true;
            for (size_t i = 0; i < pb.bias_elems(); ++i) zero = zero && pb.dbias_buf[i] == 0.0f;
            CHECK(zero);
        }
}

TEST_CASE("dynamic mask: very negative biases (-1e30) are valid logits", "[dynamic][mask][case4]")
{
    // Bias -1e30 on every even key. Causal row 0 has only key 0: its logit is -1e30 + z = -1e30,
    // so O = v_0 exactly and LSE = -1e30 (finite); every other row sees an odd key, and the
    // even keys get P = 0 (or are not selected with top-k).
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int keep : {0, 1, 3}) {
            std::mt19937_64 rng(seed_for("dyn-neg-bias", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = {0, 70};
            c.causal = true;
            c.wl = idx % 2 ? 1 : -1;
            c.block_q = 16;
            c.block_k = 7;
            c.key_bias_heads = 1;
            c.keep_k = keep;
            Problem pb(c, Storage::Packed, rng);
            std::vector<double> b = pb.cfg.bias;
            for (size_t j = 0; j < b.size(); j += 2) b[j] = -1e30;
            pb.set_bias(b);
            Plan plan(c);
            require_plan(plan);
            INFO("config: " << c.describe());
            REQUIRE(check_against_oracle(plan, pb));
            int64_t bad_o = 0;
            for (int h = 0; h < c.H; ++h) {
                for (int cc = 0; cc < c.Dv; ++cc) bad_o += pb.o.bits(0, h, cc) != pb.v.bits(0, 0, cc);
                CHECK(lse_at(pb, h, 0) == (float)-1e30);
            }
            CHECK(bad_o == 0);
            // The -1e30 row hides every other row's LSE error in lse_rel_err's max|ref| scale:
            // measure those rows on their own.
            const FwdResult ref = oracle_forward(pb.cfg, pb.q.to_dense(), pb.k.to_dense(), pb.v.to_dense());
            double worst = 0;
            for (int h = 0; h < c.H; ++h)
                for (int64_t t = 1; t < c.Tq(); ++t) {
                    const double r = ref.lse[(size_t)(h * c.Tq() + t)];
                    worst = std::max(worst, std::fabs(lse_at(pb, h, t) - r) / std::max(1.0, std::fabs(r)));
                }
            CHECK(worst <= 1e-5); // same stored inputs on both sides: float32 LSE rounding only
        }
}

TEST_CASE("dynamic mask: scratch poisoned by NaN inputs changes nothing", "[dynamic][case7]")
{
    for (ringattn_dtype_t dt : all_dtypes) {
        std::mt19937_64 rng(seed_for("dyn-case7", (uint64_t)dt));
        AttnConfig c;
        c.dtype = dt;
        c.H = 4;
        c.Hkv = 2;
        c.D = 32;
        c.Dv = 24;
        c.cu_q = {0, 77, 200};
        c.causal = true;
        c.wl = 50;
        c.block_q = 32;
        c.block_k = 16;
        c.num_threads = 2;
        c.key_bias_heads = 2;
        c.keep_k = 9;
        Problem clean(c, Storage::Packed, rng);
        Plan plan(c);
        require_plan(plan);
        REQUIRE(check_against_oracle(plan, clean));
        const Outputs ref(clean);
        Problem nan_pb(c, Storage::Packed, rng);
        for (TView *t : {&nan_pb.q, &nan_pb.k, &nan_pb.v, &nan_pb.dout}) t->poison();
        REQUIRE(run_forward(plan, nan_pb) == RINGATTN_SUCCESS);
        REQUIRE(run_backward(plan, nan_pb) == RINGATTN_SUCCESS);
        run_both(plan, clean);
        const Outputs got(clean);
        INFO("dtype " << dtype_name(dt));
        CHECK(got.o == ref.o);
        CHECK(same_floats(got.lse, ref.lse));
        CHECK(got.dq == ref.dq);
        CHECK(got.dk == ref.dk);
        CHECK(got.dv == ref.dv);
        CHECK(same_floats(got.dbias, ref.dbias));
    }
}

TEST_CASE("dynamic mask: a plan is reusable, backward selects from the bias it is given", "[dynamic][bwd]")
{
    // Problems A and B share a plan and differ in their bias (so in their selections). Forward A,
    // forward B, backward A must equal forward A, backward A bitwise; and a fresh plan's first call
    // being a backward (O and LSE from elsewhere) must give the same, bitwise: no selection state
    // carried over from an earlier call.
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16})
        for (int ring_like = 0; ring_like < 2; ++ring_like) {
            std::mt19937_64 rng(seed_for("dyn-reuse", (uint64_t)(dt * 2 + ring_like)));
            AttnConfig c;
            c.dtype = dt;
            c.H = 4;
            c.Hkv = 2;
            c.D = 32;
            c.Dv = 16;
            c.cu_q = {0, 120, 181};
            c.causal = ring_like != 0;
            c.block_q = 16;
            c.block_k = 16;
            c.key_bias_heads = 2;
            c.keep_k = 6;
            Problem a(c, Storage::Packed, rng), b(c, Storage::Packed, rng);
            Plan plan(c);
            require_plan(plan);
            REQUIRE(check_against_oracle(plan, a));
            const Outputs ref(a);
            // forward B in between
            b.poison_forward_outputs();
            REQUIRE(run_forward(plan, b) == RINGATTN_SUCCESS);
            a.poison_backward_outputs();
            REQUIRE(run_backward(plan, a) == RINGATTN_SUCCESS);
            Outputs got(a);
            CHECK(got.dq == ref.dq);
            CHECK(got.dk == ref.dk);
            CHECK(got.dv == ref.dv);
            CHECK(same_floats(got.dbias, ref.dbias));
            // a fresh plan whose first call is this backward
            Plan fresh(c);
            require_plan(fresh);
            a.poison_backward_outputs();
            REQUIRE(run_backward(fresh, a) == RINGATTN_SUCCESS);
            got = Outputs(a);
            CHECK(got.dq == ref.dq);
            CHECK(got.dk == ref.dk);
            CHECK(got.dv == ref.dv);
            CHECK(same_floats(got.dbias, ref.dbias));
            // and B's forward was B's own
            REQUIRE(check_against_oracle(plan, b));
        }
}

// ------------------------------------------------------------------------------------------
// The oracle's selection against a brute-force rank count, and its forward against it.

TEST_CASE("oracle selection equals a brute-force rank count", "[dynamic][oracle]")
{
    // keep(i, j) <=> j valid and #{j' valid : b[j'] > b[j] or (b[j'] == b[j] and j' < j)} < keep_k
    // (which also keeps every valid key of a row with at most keep_k of them). The forward with
    // Q = 0 and V = one-hot(key) then has O_i[j] > 0 exactly on the kept keys.
    std::mt19937_64 rng(seed_for("dyn-oracle-select", 0));
    for (int it = 0; it < 200; ++it) {
        AttnConfig c;
        c.H = 2;
        c.Hkv = 1;
        c.D = 1;
        std::vector<int> lq, lk;
        const int nseq = 1 + (int)(rng() % 3);
        for (int s = 0; s < nseq; ++s) {
            lq.push_back((int)(rng() % 14));
            lk.push_back(rng() % 3 == 0 ? (int)(rng() % 14) : lq.back() + (int)(rng() % 5));
        }
        c.cu_q = cu_from_lengths(lq);
        c.cu_k = cu_from_lengths(lk);
        c.causal = rng() % 2;
        const int ws[] = {-1, 0, 1, 3, 20};
        c.wl = ws[rng() % 5];
        c.wr = ws[rng() % 5];
        c.key_bias_heads = 1 + (int)(rng() % 2);
        c.keep_k = (int)(rng() % 6);
        const int64_t Tq = c.Tq(), Tk = c.Tk();
        std::uniform_int_distribution<int> q4(-4, 4);
        c.bias.resize((size_t)(c.key_bias_heads * Tk));
        for (double &x : c.bias) x = q4(rng) / 4.0; // many ties
        c.Dv = (int)std::max<int64_t>(1, Tk);
        Dense Q(Tq, 2, 1), K(Tk, 1, 1), V(Tk, 1, c.Dv);
        for (int64_t j = 0; j < Tk; ++j) V.at(j, 0, (int)j) = 1.0;
        const FwdResult r = oracle_forward(c, Q, K, V);
        int bad = 0;
        for (int sq = 0; sq < nseq; ++sq) {
            const int64_t q0 = c.cu_q[sq], k0 = c.cu_k[sq], Lq = lq[sq], Lk = lk[sq], delta = Lk - Lq;
            for (int64_t p = 0; p < Lq; ++p)
                for (int h = 0; h < 2; ++h) {
                    auto valid = [&](int64_t pj) {
                        const int wr = c.causal ? 0 : c.wr;
                        return (c.wl < 0 || pj >= p + delta - c.wl) && (wr < 0 || pj <= p + delta + wr);
                    };
                    auto b = [&](int64_t pj) { return c.bias[(size_t)(c.bias_head(h) * Tk + k0 + pj)]; };
                    std::vector<int64_t> expect;
                    for (int64_t pj = 0; pj < Lk; ++pj) {
                        if (!valid(pj)) continue;
                        int64_t above = 0;
                        for (int64_t pj2 = 0; pj2 < Lk; ++pj2)
                            above += valid(pj2) && (b(pj2) > b(pj) || (b(pj2) == b(pj) && pj2 < pj));
                        if (c.keep_k == 0 || above < c.keep_k) expect.push_back(k0 + pj);
                    }
                    bad += oracle_kept_keys(c, q0 + p, h) != expect;
                    for (int64_t j = 0; j < Tk; ++j) {
                        const bool kept = std::find(expect.begin(), expect.end(), j) != expect.end();
                        bad += kept != (r.O.at(q0 + p, h, (int)j) > 0);
                    }
                }
        }
        INFO(c.describe());
        CHECK(bad == 0);
    }
}
