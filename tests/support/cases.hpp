// Case builders and runners shared by the unit tests of the public API (tests/unit): random
// shapes and masks, running one case against the float64 oracle, SPEC 10 case 7's NaN-input run,
// and bitwise comparisons of two runs' outputs. Header-only; the Catch2 assertions in these
// helpers count for the test case that calls them.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <vector>

#include "support/device.hpp"
#include "support/shim.hpp"
#include "support/spec9.hpp"

namespace ratest {

inline const ringattn_dtype_t all_dtypes[] = {RINGATTN_FLOAT32, RINGATTN_FLOAT16, RINGATTN_BFLOAT16};
inline const float NINF = -std::numeric_limits<float>::infinity();

inline void require_plan(const Plan &p)
{
    INFO("plan_create: " << ringattn_last_error());
    REQUIRE(p.ok());
}

inline int pick(std::mt19937_64 &rng, std::initializer_list<int> xs)
{
    return *(xs.begin() + (ptrdiff_t)(rng() % xs.size()));
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

// Key lengths for the query lengths `lq` (c.cu_q): half of the time the same as the queries (no
// cu_k), else a KV cache (up to 59 more keys per sequence) or up to 19 fewer keys than queries.
inline void set_random_keys(AttnConfig &c, const std::vector<int> &lq, std::mt19937_64 &rng)
{
    const int kmode = (int)(rng() % 4);
    if (kmode == 1 || kmode == 2) {
        std::vector<int> lk;
        for (int l : lq) lk.push_back(kmode == 1 ? l + (int)(rng() % 60) : std::max(0, l - (int)(rng() % 20)));
        c.cu_k = cu_from_lengths(lk);
    }
}

// Softcap (half of the time), ALiBi (a quarter) and a non-default scale (a third), each drawn.
inline void set_random_logit_options(AttnConfig &c, std::mt19937_64 &rng)
{
    if (rng() % 2) c.softcap = (float)pick(rng, {5, 30});
    if (rng() % 4 == 0) c.alibi = alibi_slopes(c.H);
    if (rng() % 3 == 0) c.scale = (float)(pick(rng, {3, 7, 13}) / 10.0);
}

// One mask type for every test: SPEC 3's causal flag and window sides (-1 = unbounded).
struct Mask {
    const char *name;
    int causal, wl, wr;
};

inline void apply(AttnConfig &c, const Mask &m)
{
    c.causal = m.causal != 0;
    c.wl = m.wl;
    c.wr = m.wr;
}

// Families the unit tests draw masks from; each test file lists the ones it iterates over (the
// dynamic mask tests use the first four).
enum class MaskKind { None, Causal, Window, CausalWindow, HugeWindow, Narrow };

// Draws a mask of kind k, applies it to c and returns it.
inline Mask set_mask(AttnConfig &c, MaskKind k, std::mt19937_64 &rng)
{
    Mask m{"none", 0, -1, -1};
    switch (k) {
    case MaskKind::None: break;
    case MaskKind::Causal: m = {"causal", 1, -1, -1}; break;
    case MaskKind::Window: // two-sided, sometimes one side unbounded
        m = {"window", 0, pick(rng, {-1, 0, 3, 17, 40}), pick(rng, {0, 2, 9, 33})};
        break;
    case MaskKind::CausalWindow: m = {"causal window", 1, pick(rng, {0, 1, 9, 31}), -1}; break;
    case MaskKind::HugeWindow: // >= every length: same as unbounded
        m = {"huge window", 0, pick(rng, {1000, 100000}), pick(rng, {-1, 1000, 2147483647})};
        break;
    case MaskKind::Narrow: // (0, 0): each query sees only its aligned key (none when delta < 0)
        m = {"narrow", 0, 0, 0};
        break;
    }
    apply(c, m);
    return m;
}

// The ring tests' catalogue (threads and MPI). Masks against shards of about 160 / P tokens:
// a window wider than a shard, one so narrow that whole shards are masked, both sides.
inline const Mask ring_masks[] = {{"none", 0, -1, -1},          {"causal", 1, -1, -1},
                                  {"window wide", 1, 60, 0},    {"window narrow", 1, 5, 0},
                                  {"band both sides", 0, 7, 3}, {"causal+window", 1, 25, -1}};

// The ring tests' batch under mask m: ragged lengths 97, 1, 3, 0, 59 (sequences shorter than
// P, one empty), H = 4 on H_kv = 2, D = 32; small tiles (16 x 24) so that a shard has many;
// one thread per rank.
inline AttnConfig ring_batch(const Mask &m, ringattn_dtype_t dt = RINGATTN_FLOAT32)
{
    AttnConfig c;
    c.H = 4;
    c.Hkv = 2;
    c.D = 32;
    c.dtype = dt;
    c.cu_q = {0, 97, 98, 101, 101, 160};
    c.block_q = 16;
    c.block_k = 24;
    c.num_threads = 1;
    apply(c, m);
    return c;
}

// c with a key bias of hb heads and a top-k of keep_k (SPEC 6).
inline AttnConfig with_bias(AttnConfig c, int hb, int keep_k)
{
    c.key_bias_heads = hb;
    c.keep_k = keep_k;
    return c;
}

// Softcap, ALiBi, MQA (H = 4, H_kv = 1) and D_v != D, causal with a window, two sequences.
inline AttnConfig ring_softcap_alibi_mqa()
{
    AttnConfig c = ring_batch({"causal+window", 1, 30, -1});
    c.Hkv = 1;
    c.D = 40;
    c.Dv = 24;
    c.cu_q = {0, 70, 131};
    c.softcap = 5.0f;
    c.alibi = {0.5f, 0.25f, 0.125f, 0.0625f};
    return c;
}

// SPEC 10 case 12's inputs: every entry of Q is +-x (random signs) and every key row has the
// same signs times x, so all logits of a row are equal in exact arithmetic.
inline void set_equal_logit_qk(Problem &pb, double x, std::mt19937_64 &rng)
{
    const AttnConfig &c = pb.cfg;
    std::vector<int> key_signs((size_t)c.D);
    for (int &sgn : key_signs) sgn = rng() % 2 ? 1 : -1;
    for (int64_t t = 0; t < c.Tq(); ++t)
        for (int cc = 0; cc < c.D; ++cc) {
            for (int h = 0; h < c.H; ++h) pb.q.set(t, h, cc, rng() % 2 ? x : -x);
            for (int h = 0; h < c.hkv(); ++h) pb.k.set(t, h, cc, key_signs[(size_t)cc] * x);
        }
}

// SPEC 10 case 12 with a softcap (issue 28, finding 9): entries of Q and K of +-x whose products
// partial sums overflow float32 when only the scale goes before the product, while the tanh's
// argument, q . k scale / softcap, does not. Every query row is +-x in its first D - 1 columns
// (one random sign per row), every key row +-x: its first (D - 1) / 2 columns of one random
// sign, the next (D - 1) / 2 of the other, the last of a third: so q . k = +-x^2 (the last
// column's product) after partial sums of (D - 1) / 2 x^2 of one sign. Column D - 1 is 0. At
// x = 1.5e19, D = 16, scale 0.25 and softcap 5: 7 scaled terms of 5.6e37 overflow (3.9e38), and
// the logits +-softcap come out as the first half's sign for half of the keys; with 1/softcap
// folded into the scale the terms are 1.1e37 and every logit is exactly +-softcap (the tanh
// saturates, in float32 and float64 alike).
inline void set_softcap_overflow_qk(Problem &pb, double x, std::mt19937_64 &rng)
{
    const AttnConfig &c = pb.cfg;
    const int half = (c.D - 1) / 2;
    for (int64_t t = 0; t < c.Tq(); ++t) {
        for (int h = 0; h < c.H; ++h) {
            const double sq = rng() % 2 ? x : -x;
            for (int cc = 0; cc < c.D; ++cc) pb.q.set(t, h, cc, cc < 2 * half + 1 ? sq : 0.0);
        }
        for (int h = 0; h < c.hkv(); ++h) {
            const double first = rng() % 2 ? x : -x, last = rng() % 2 ? x : -x;
            for (int cc = 0; cc < c.D; ++cc)
                pb.k.set(t, h, cc, cc < half ? first : cc < 2 * half ? -first : cc == 2 * half ? last : 0.0);
        }
    }
}

inline Problem packed_problem(const AttnConfig &c, uint64_t seed, double sigma_bias = 1.0)
{
    std::mt19937_64 rng(seed);
    return Problem(c, Storage::Packed, rng, 1.0, sigma_bias);
}

// The ring tests' SPEC 10 case 11 or 12 on batch c (its cu_q becomes {0, 100, 131}): a key bias
// of -1e30 on every key (each row's softmax exactly uniform, its LSE -1e30 without log(l)), or
// q and k entries of +-2^63 with scale 2^-7 (the unscaled sums overflow, the scaled ones are
// exact) with every key of the same signs. Both have lossy LSE rows whose max and sum the
// backward recomputes; the logits are exact, so the plain limits apply.
inline Problem lossy_lse_problem(AttnConfig c, int which)
{
    c.cu_q = {0, 100, 131};
    if (which == 11) {
        c.key_bias_heads = 1;
        c.bias.assign(131, -1e30);
    } else {
        c.scale = 0.0078125f;
    }
    Problem pb = packed_problem(c, 5000 + (uint64_t)which);
    if (which == 12) {
        std::mt19937_64 rng(5012);
        set_equal_logit_qk(pb, std::ldexp(1.0, 63), rng);
    }
    return pb;
}

// A problem with packed inputs (the ring harness reads them row by row), drawn from seed; its
// bias, when c has one and does not give it, from N(0, sigma_bias).

// The masks of the "rows with no allowed key" cases, for a first sequence of 60 queries and 30
// keys (delta = -30) and tiles of 8: 0 causal (its rows 0..29 empty), 1 window (-1, 3) (rows with
// p - 30 + 3 < 0 empty), 2 causal with window_left 2, 3 window (0, 0) with softcap 4 (one key per
// row at most).
inline void set_empty_rows_mask(AttnConfig &c, int variant)
{
    switch (variant) {
    case 0: c.causal = true; break;
    case 1: c.wl = -1, c.wr = 3; break;
    case 2: c.causal = true, c.wl = 2; break;
    case 3: c.wl = 0, c.wr = 0, c.softcap = 4; break;
    }
}

// Batches without a single query token: {cu_q, cu_k} (an empty cu_k: the same as cu_q) with no
// sequence, only empty sequences, and keys in sequences without queries.
inline const std::vector<int32_t> empty_batches[4][2] = {
    {{0}, {}},
    {{0, 0, 0}, {}},
    {{0, 0, 0}, {0, 0, 5}},
    {{0, 0, 3}, {0, 4, 4}},
};

// Interleaved storage needs T_q == T_k: a problem with separate key lengths gets Padded instead.
inline Storage random_storage(std::mt19937_64 &rng, const AttnConfig &c)
{
    Storage st = (Storage)(rng() % 4);
    if (st == Storage::Interleaved && !c.cu_k.empty()) st = Storage::Padded;
    return st;
}

// Biases rounded to multiples of 1/2: many exact ties, so the tie rule (lower position wins) is
// exercised in every kept/not-kept boundary that falls on a tie.
inline std::vector<double> quantized(const std::vector<double> &b)
{
    std::vector<double> q(b);
    for (double &x : q) x = std::round(2 * x) / 2;
    return q;
}

struct CaseOpts {
    Storage st = Storage::Packed;
    double sigma_qk = 1.0, sigma_bias = 1.0;
    bool quantize = false, determinism = false, want_dbias = true;
};

// One case: a random problem for c (see Problem), its plan, and check_against_oracle.
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

// Forward then backward, every output poisoned first; both must succeed.
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

// SPEC 10 case 7: forward and backward on all-NaN inputs (Q, K, V, dO), so that the plan's
// scratch fills with NaN; both calls must still succeed.
inline void run_on_nan_inputs(const Plan &plan, Problem &pb)
{
    for (TView *t : {&pb.q, &pb.k, &pb.v, &pb.dout}) t->poison();
    REQUIRE(run_forward(plan, pb) == RINGATTN_SUCCESS);
    REQUIRE(run_backward(plan, pb) == RINGATTN_SUCCESS);
}

// Number of (row, head) pairs with LSE exactly -inf.
inline int64_t count_empty_rows(const Problem &pb)
{
    int64_t n = 0;
    for (int64_t i = 0; i < pb.cfg.H * pb.cfg.Tq(); ++i) n += pb.lse[(size_t)i] == NINF;
    return n;
}

inline double lse_at(const Problem &pb, int h, int64_t t) { return pb.lse[(size_t)(h * pb.cfg.Tq() + t)]; }

inline bool same_floats(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Bitwise copies of every output.
struct Outputs {
    std::vector<unsigned char> o, dq, dk, dv;
    std::vector<float> lse, dbias;
    bool has_bias;
    explicit Outputs(const Problem &pb)
        : o(pb.o.buf->bytes), dq(pb.dq.buf->bytes), dk(pb.dk.buf->bytes), dv(pb.dv.buf->bytes),
          lse(pb.lse), dbias(pb.dbias_buf), has_bias(pb.cfg.has_bias())
    {
    }
};

// O and LSE of two runs bitwise equal (one CHECK each).
inline void check_same_forward(const Outputs &got, const Outputs &ref)
{
    CHECK(got.o == ref.o);
    CHECK(same_floats(got.lse, ref.lse));
}

// dQ, dK, dV and, for a problem with a bias, dBias of two runs bitwise equal (one CHECK each).
inline void check_same_backward(const Outputs &got, const Outputs &ref)
{
    CHECK(got.dq == ref.dq);
    CHECK(got.dk == ref.dk);
    CHECK(got.dv == ref.dv);
    if (ref.has_bias) CHECK(same_floats(got.dbias, ref.dbias));
}

// SPEC 10 case 7 on one plan for c: a clean problem matches the oracle; the same plan then runs
// on all-NaN inputs (its scratch fills with NaN) and again on the clean problem, whose outputs
// must be bitwise those of its first run.
inline void check_poisoned_scratch_changes_nothing(const AttnConfig &c, std::mt19937_64 &rng)
{
    Problem clean(c, Storage::Packed, rng);
    Plan plan(c);
    require_plan(plan);
    REQUIRE(check_against_oracle(plan, clean));
    const Outputs ref(clean);
    Problem nan_pb(c, Storage::Packed, rng);
    run_on_nan_inputs(plan, nan_pb);
    run_both(plan, clean);
    const Outputs got(clean);
    check_same_forward(got, ref);
    check_same_backward(got, ref);
}

// SPEC 9: the thread count changes no bit. One problem for c, run by plans at num_threads 1
// and at each of `threads` (every output poisoned first): O, LSE, dQ, dK, dV and dBias bitwise
// those of the one-thread run, which also matches the oracle.
inline void check_thread_counts_change_nothing(const AttnConfig &c, std::mt19937_64 &rng,
                                               std::initializer_list<int> threads)
{
    AttnConfig one = c;
    one.num_threads = 1;
    Problem pb(one, Storage::Packed, rng);
    Plan base(one);
    require_plan(base);
    REQUIRE(check_against_oracle(base, pb));
    const Outputs ref(pb);
    for (int t : threads) {
        AttnConfig ct = c;
        ct.num_threads = t;
        Plan plan(ct);
        require_plan(plan);
        INFO("num_threads " << t << ", config " << c.describe());
        run_both(plan, pb);
        const Outputs got(pb);
        check_same_forward(got, ref);
        check_same_backward(got, ref);
    }
}

// A small random batch for checks of which keys each query sees: 1 to 3 sequences of 0 to
// max_len - 1 queries with (a third of the time) 0 to max_len - 1 keys, else as many keys as
// queries or up to 4 more; a random causal flag and window sides (-1, 0, 1, 3 or 20). Sets
// c.cu_q, c.cu_k and the mask; the lengths are returned in lq and lk.
inline void random_small_masked_batch(AttnConfig &c, std::mt19937_64 &rng, int max_len,
                                      std::vector<int> &lq, std::vector<int> &lk)
{
    lq.clear();
    lk.clear();
    const int nseq = 1 + (int)(rng() % 3);
    for (int s = 0; s < nseq; ++s) {
        lq.push_back((int)(rng() % (uint64_t)max_len));
        lk.push_back(rng() % 3 == 0 ? (int)(rng() % (uint64_t)max_len) : lq.back() + (int)(rng() % 5));
    }
    c.cu_q = cu_from_lengths(lq);
    c.cu_k = cu_from_lengths(lk);
    c.causal = rng() % 2;
    const int ws[] = {-1, 0, 1, 3, 20};
    c.wl = ws[rng() % 5];
    c.wr = ws[rng() % 5];
}

// The oracle's forward for c with Q = K = 0, so that every logit a query sees is equal up to its
// bias, and V = one-hot of the key index (c.Dv is set to T_k, at least 1): O_i[j] > 0 exactly
// for the keys j that query i uses.
inline FwdResult oracle_one_hot_forward(AttnConfig &c)
{
    const int64_t Tq = c.Tq(), Tk = c.Tk();
    c.Dv = (int)std::max<int64_t>(1, Tk);
    Dense Q(Tq, c.H, c.D), K(Tk, c.hkv(), c.D), V(Tk, c.hkv(), c.Dv);
    for (int64_t j = 0; j < Tk; ++j)
        for (int h = 0; h < c.hkv(); ++h) V.at(j, h, (int)j) = 1.0;
    return oracle_forward(c, Q, K, V);
}

} // namespace ratest
