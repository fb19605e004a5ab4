// Shared helpers of the dynamic mask tests (test_dynamic_*.cpp): random configurations of
// SPEC 6 (bias heads, keep_k, masks), running a case against the float64 oracle, and comparing
// two runs bitwise. Header-only; each test file includes it once.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "support/shim.hpp"

namespace dyntest {

using namespace ratest;


inline const ringattn_dtype_t all_dtypes[] = {RINGATTN_FLOAT32, RINGATTN_FLOAT16, RINGATTN_BFLOAT16};
inline const float NINF = -std::numeric_limits<float>::infinity();

inline int pick(std::mt19937_64 &rng, std::initializer_list<int> xs)
{
    return *(xs.begin() + (ptrdiff_t)(rng() % xs.size()));
}

inline void require_plan(const Plan &p)
{
    INFO("plan_create: " << ringattn_last_error());
    REQUIRE(p.ok());
}

// Ragged lengths: mostly random in [2, maxlen], with 0 and 1 mixed in.
inline std::vector<int> ragged(std::mt19937_64 &rng, int nseq, int maxlen)
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

inline void set_mask(AttnConfig &c, Mask m, std::mt19937_64 &rng)
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
inline int bias_heads(const AttnConfig &c, int choice) { return choice == 0 ? 1 : choice == 1 ? c.hkv() : c.H; }

// keep_k for choice 0..4: none, 1, small (3), moderate (a fraction of the longest key sequence),
// more than T_k.
inline int keep_choice(const AttnConfig &c, int choice, std::mt19937_64 &rng)
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
inline std::vector<double> quantized(const std::vector<double> &b)
{
    std::vector<double> q(b);
    for (double &x : q) x = std::round(2 * x) / 2;
    return q;
}

// Random problem with a bias; `it` cycles H_b, keep_k and the mask so that every combination
// shows up in a few dozen cases. Some sequence has at least 3 KV blocks of block_k keys.
inline AttnConfig random_dyn_config(std::mt19937_64 &rng, ringattn_dtype_t dt, int maxlen, int it)
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

inline bool run_case(const AttnConfig &c, std::mt19937_64 &rng, const CaseOpts &o = CaseOpts())
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

inline Storage random_storage(std::mt19937_64 &rng, const AttnConfig &c)
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

inline bool same_floats(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline void run_both(const Plan &plan, Problem &pb)
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

inline double lse_at(const Problem &pb, int h, int64_t t) { return pb.lse[(size_t)(h * pb.cfg.Tq() + t)]; }


} // namespace dyntest
