// ringattn_merge_partials (SPEC 5, SPEC 10 case 6): partials of attention over disjoint key sets,
// computed by the float64 oracle or by the library, merge into attention over the union.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "support/shim.hpp"
#include "support/spec9.hpp"

using namespace ratest;

namespace {

const float NINF = -std::numeric_limits<float>::infinity();
const float PINF = std::numeric_limits<float>::infinity();
const ringattn_dtype_t all_dtypes[] = {RINGATTN_FLOAT32, RINGATTN_FLOAT16, RINGATTN_BFLOAT16};

struct Partial {
    TView o;
    std::vector<float> lse; // [H, T]
};

// Partials of the oracle over key subsets: key j goes to partial owner[j] (0..n-1).
struct Split {
    AttnConfig cfg;
    Dense Q, K, V;
    FwdResult full;
    std::vector<Partial> parts;
};

Split make_split(std::mt19937_64 &rng, ringattn_dtype_t dt, int n, bool padded, double empty_frac)
{
    Split s;
    AttnConfig &c = s.cfg;
    c.dtype = dt;
    c.H = 1 + (int)(rng() % 4);
    c.D = 8 + (int)(rng() % 40);
    c.Dv = 1 + (int)(rng() % 70);
    const int nseq = 1 + (int)(rng() % 3);
    std::vector<int> lens;
    for (int i = 0; i < nseq; ++i) lens.push_back((int)(rng() % 40));
    c.cu_q = cu_from_lengths(lens);
    c.causal = rng() % 2;
    const int64_t T = c.Tq();
    TView q = make_packed(dt, T, c.H, c.D), k = make_packed(dt, T, c.H, c.D),
          v = make_packed(dt, T, c.H, c.Dv);
    fill_normal(q, rng, 1.5);
    fill_normal(k, rng, 1.5);
    fill_normal(v, rng);
    s.Q = q.to_dense();
    s.K = k.to_dense();
    s.V = v.to_dense();
    s.full = oracle_forward(c, s.Q, s.K, s.V);
    std::vector<int> owner((size_t)T);
    std::bernoulli_distribution empty(empty_frac);
    std::vector<char> part_empty((size_t)n);
    for (int p = 0; p < n; ++p) part_empty[(size_t)p] = p > 0 && empty(rng);
    for (int64_t j = 0; j < T; ++j) {
        int p;
        do p = (int)(rng() % (uint64_t)n); while (part_empty[(size_t)p]);
        owner[(size_t)j] = p;
    }
    for (int p = 0; p < n; ++p) {
        KeyFilter f((size_t)T);
        for (int64_t j = 0; j < T; ++j) f[(size_t)j] = owner[(size_t)j] == p;
        FwdResult r = oracle_forward(c, s.Q, s.K, s.V, &f);
        Partial pt;
        pt.o = padded ? make_padded(dt, T, c.H, c.Dv, 1 + p % 3, 2 * p) : make_packed(dt, T, c.H, c.Dv);
        pt.o.from_dense(r.O);
        pt.lse.assign((size_t)std::max<int64_t>(1, c.H * T), NAN);
        for (size_t i = 0; i < r.lse.size(); ++i) pt.lse[i] = (float)r.lse[i];
        // SPEC 5: the O of an empty partial may be garbage; make it NaN.
        for (int64_t t = 0; t < T; ++t)
            for (int h = 0; h < c.H; ++h)
                if (std::isinf(pt.lse[(size_t)(h * T + t)]))
                    for (int cc = 0; cc < c.Dv; ++cc) pt.o.set_nan(t, h, cc);
        s.parts.push_back(std::move(pt));
    }
    return s;
}

ringattn_status_t merge(const std::vector<const Partial *> &parts, int64_t T, int H, int Dv,
                        ringattn_dtype_t dt, TView &out, float *out_lse)
{
    std::vector<ringattn_tensor_t> os;
    std::vector<const float *> ls;
    for (const Partial *p : parts) {
        os.push_back(p->o.host_desc());
        ls.push_back(p->lse.data());
    }
    return ringattn_merge_partials((int)parts.size(), T, H, Dv, dt, os.data(), ls.data(), out.host_desc(),
                                   out_lse);
}

// The plain same-precision merge (float32 arithmetic, output rounded to dt) for SPEC 9's rule.
Dense plain_merge(const std::vector<const Partial *> &parts, int64_t T, int H, int Dv,
                  ringattn_dtype_t dt, std::vector<double> &lse_out)
{
    Dense o(T, H, Dv);
    lse_out.assign((size_t)(H * T), -INFINITY);
    for (int h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
            float mx = NINF;
            for (const Partial *p : parts) {
                const float l = p->lse[(size_t)(h * T + t)];
                if (!std::isinf(l)) mx = std::max(mx, l);
            }
            if (mx == NINF) continue;
            float W = 0;
            std::vector<float> acc((size_t)Dv, 0.0f);
            for (const Partial *p : parts) {
                const float l = p->lse[(size_t)(h * T + t)];
                if (std::isinf(l)) continue;
                const float w = std::exp(l - mx);
                W += w;
                for (int c = 0; c < Dv; ++c) acc[(size_t)c] += w * (float)p->o.get(t, h, c);
            }
            for (int c = 0; c < Dv; ++c) o.at(t, h, c) = round_to_dtype(acc[(size_t)c] / W, dt);
            lse_out[(size_t)(h * T + t)] = mx + std::log(W);
        }
    return o;
}

// Compare a merged (out, lse) with the oracle over the union of the partials' keys.
void check_union(const Split &s, const std::vector<const Partial *> &parts, const TView &out,
                 const std::vector<float> &lse)
{
    const AttnConfig &c = s.cfg;
    const int64_t T = c.Tq();
    INFO("config: " << c.describe() << " partials=" << parts.size());
    CHECK(!out.any_nonfinite());
    int64_t bad_rows = 0;
    for (int h = 0; h < c.H; ++h)
        for (int64_t t = 0; t < T; ++t) {
            const double r = s.full.lse[(size_t)(h * T + t)];
            const float g = lse[(size_t)(h * T + t)];
            if (r == -INFINITY) {
                bool ok = g == NINF;
                for (int cc = 0; cc < c.Dv; ++cc) ok = ok && out.get(t, h, cc) == 0.0;
                bad_rows += !ok;
            } else {
                bad_rows += !std::isfinite(g);
            }
        }
    CHECK(bad_rows == 0);
    const std::vector<double> lse_d(lse.begin(), lse.begin() + (ptrdiff_t)(c.H * T));
    const double e_o = spec_err(out.to_dense(), s.full.O, s.full.O_mag);
    const double e_l = spec_lse_err(lse_d, s.full.lse), lim = f32_limit_out(s.full.max_logit);
    if (c.dtype == RINGATTN_FLOAT32) {
        CHECK(e_o <= lim);
        CHECK(e_l <= lim);
    } else { // SPEC 9: 2x the plain merge's error, never below the float32 limit
        std::vector<double> pl;
        const Dense po = plain_merge(parts, T, c.H, c.Dv, c.dtype, pl);
        CHECK(e_o <= std::max(2 * spec_err(po, s.full.O, s.full.O_mag), lim));
        CHECK(e_l <= std::max(2 * spec_lse_err(pl, s.full.lse), lim));
    }
}

std::vector<const Partial *> ptrs(const Split &s)
{
    std::vector<const Partial *> v;
    for (const Partial &p : s.parts) v.push_back(&p);
    return v;
}

// Output buffer and LSE of one merge, poisoned.
struct Out {
    TView o;
    std::vector<float> lse;
    Out(const AttnConfig &c, bool padded)
        : o(padded ? make_padded(c.dtype, c.Tq(), c.H, c.Dv, 2, 3) : make_packed(c.dtype, c.Tq(), c.H, c.Dv)),
          lse((size_t)std::max<int64_t>(1, c.H * c.Tq()), NAN)
    {
    }
};

double max_rel_diff(const TView &a, const TView &b)
{
    return max_rel_err(a.to_dense(), b.to_dense());
}

double lse_diff(const std::vector<float> &a, const std::vector<float> &b)
{
    double num = 0, den = 1;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::isinf(a[i]) || std::isinf(b[i])) {
            if (a[i] != b[i]) return INFINITY;
            continue;
        }
        num = std::max(num, (double)std::fabs(a[i] - b[i]));
        den = std::max(den, (double)std::fabs(a[i]));
    }
    return num / den;
}

} // namespace

TEST_CASE("merge of oracle partials equals attention over the union, all dtypes", "[merge]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int n : {1, 2, 3, 8})
            for (bool padded : {false, true}) {
                std::mt19937_64 rng(seed_for("merge-union", (uint64_t)idx++));
                Split s = make_split(rng, dt, n, padded, n == 8 ? 0.3 : 0.0);
                Out out(s.cfg, padded);
                const auto before = snapshot(out.o);
                const ringattn_status_t st =
                    merge(ptrs(s), s.cfg.Tq(), s.cfg.H, s.cfg.Dv, dt, out.o, out.lse.data());
                INFO(ringattn_last_error());
                REQUIRE(st == RINGATTN_SUCCESS);
                CHECK(padding_unchanged(before, {&out.o}));
                check_union(s, ptrs(s), out.o, out.lse);
            }
}

TEST_CASE("merge with an empty partial is the identity (SPEC 10 case 6)", "[merge]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (float marker : {NINF, PINF}) {
            std::mt19937_64 rng(seed_for("merge-identity", (uint64_t)idx++));
            Split s = make_split(rng, dt, 1, false, 0.0);
            const int64_t T = s.cfg.Tq();
            const int H = s.cfg.H, Dv = s.cfg.Dv;
            Partial empty;
            empty.o = make_packed(dt, T, H, Dv); // all NaN: must never be read into the result
            empty.lse.assign(s.parts[0].lse.size(), marker);
            const Partial &x = s.parts[0];
            INFO("dtype " << dtype_name(dt) << " marker " << marker);
            for (int order = 0; order < 3; ++order) {
                std::vector<const Partial *> v;
                if (order == 0) v = {&empty, &x};
                if (order == 1) v = {&x, &empty};
                if (order == 2) v = {&empty, &x, &empty};
                Out out(s.cfg, false);
                REQUIRE(merge(v, T, H, Dv, dt, out.o, out.lse.data()) == RINGATTN_SUCCESS);
                // identity: bitwise equal to x (weights 1 and 0; log(1) = 0)
                bool same = true;
                for (int64_t t = 0; t < T; ++t)
                    for (int h = 0; h < H; ++h) {
                        const bool row_empty = std::isinf(x.lse[(size_t)(h * T + t)]);
                        for (int c = 0; c < Dv; ++c)
                            same = same && (row_empty ? out.o.get(t, h, c) == 0.0
                                                      : out.o.bits(t, h, c) == x.o.bits(t, h, c));
                        const float gl = out.lse[(size_t)(h * T + t)], xl = x.lse[(size_t)(h * T + t)];
                        same = same && (row_empty ? gl == NINF : gl == xl);
                    }
                INFO("order " << order);
                CHECK(same);
            }
            // empty + empty (+ empty): O = 0, LSE = -inf everywhere
            Out out(s.cfg, false);
            REQUIRE(merge({&empty, &empty, &empty}, T, H, Dv, dt, out.o, out.lse.data()) == RINGATTN_SUCCESS);
            bool zero = true;
            for (int64_t t = 0; t < T; ++t)
                for (int h = 0; h < H; ++h) {
                    zero = zero && out.lse[(size_t)(h * T + t)] == NINF;
                    for (int c = 0; c < Dv; ++c) zero = zero && out.o.get(t, h, c) == 0.0;
                }
            CHECK(zero);
        }
}

TEST_CASE("merge is commutative and associative within float32 rounding", "[merge]")
{
    for (int it = 0; it < 12; ++it) {
        std::mt19937_64 rng(seed_for("merge-assoc", (uint64_t)it));
        Split s = make_split(rng, RINGATTN_FLOAT32, 3, it % 2, it % 3 == 0 ? 0.5 : 0.0);
        const AttnConfig &c = s.cfg;
        const int64_t T = c.Tq();
        const Partial &a = s.parts[0], &b = s.parts[1], &d = s.parts[2];
        INFO("config: " << c.describe());
        Out ab(c, false), ba(c, false), bc(c, false), ab_c(c, false), a_bc(c, false), abc(c, false),
            cba(c, false);
        REQUIRE(merge({&a, &b}, T, c.H, c.Dv, c.dtype, ab.o, ab.lse.data()) == RINGATTN_SUCCESS);
        REQUIRE(merge({&b, &a}, T, c.H, c.Dv, c.dtype, ba.o, ba.lse.data()) == RINGATTN_SUCCESS);
        REQUIRE(merge({&b, &d}, T, c.H, c.Dv, c.dtype, bc.o, bc.lse.data()) == RINGATTN_SUCCESS);
        Partial pab{ab.o, ab.lse}, pbc{bc.o, bc.lse};
        REQUIRE(merge({&pab, &d}, T, c.H, c.Dv, c.dtype, ab_c.o, ab_c.lse.data()) == RINGATTN_SUCCESS);
        REQUIRE(merge({&a, &pbc}, T, c.H, c.Dv, c.dtype, a_bc.o, a_bc.lse.data()) == RINGATTN_SUCCESS);
        REQUIRE(merge({&a, &b, &d}, T, c.H, c.Dv, c.dtype, abc.o, abc.lse.data()) == RINGATTN_SUCCESS);
        REQUIRE(merge({&d, &b, &a}, T, c.H, c.Dv, c.dtype, cba.o, cba.lse.data()) == RINGATTN_SUCCESS);
        // float32 rounding: a few ulps (2^-24 each) of the largest |O|
        const double tol = 1e-6;
        CHECK(max_rel_diff(ab.o, ba.o) <= tol);
        CHECK(lse_diff(ab.lse, ba.lse) <= tol);
        CHECK(max_rel_diff(ab_c.o, a_bc.o) <= tol);
        CHECK(lse_diff(ab_c.lse, a_bc.lse) <= tol);
        CHECK(max_rel_diff(ab_c.o, abc.o) <= tol);
        CHECK(lse_diff(ab_c.lse, abc.lse) <= tol);
        CHECK(max_rel_diff(abc.o, cba.o) <= tol);
        CHECK(lse_diff(abc.lse, cba.lse) <= tol);
        check_union(s, ptrs(s), ab_c.o, ab_c.lse);
        check_union(s, ptrs(s), abc.o, abc.lse);
    }
}

TEST_CASE("merge reads FlashAttention 2's +inf LSE as an empty partial", "[merge]")
{
    for (int it = 0; it < 6; ++it) {
        std::mt19937_64 rng(seed_for("merge-fa2", (uint64_t)it));
        const ringattn_dtype_t dt = all_dtypes[it % 3];
        Split s = make_split(rng, dt, 4, false, 0.0);
        const AttnConfig &c = s.cfg;
        const int64_t T = c.Tq();
        // Partials whose rows are empty get FA2's marker, and some rows of a whole partial too.
        for (Partial &p : s.parts)
            for (float &l : p.lse)
                if (l == NINF) l = PINF;
        Out out(c, false);
        REQUIRE(merge(ptrs(s), T, c.H, c.Dv, dt, out.o, out.lse.data()) == RINGATTN_SUCCESS);
        check_union(s, ptrs(s), out.o, out.lse);
    }
}

TEST_CASE("merge in place: the output aliases partial 0", "[merge]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (bool padded : {false, true}) {
            std::mt19937_64 rng(seed_for("merge-inplace", (uint64_t)idx++));
            Split s = make_split(rng, dt, 5, padded, 0.3);
            const AttnConfig &c = s.cfg;
            const int64_t T = c.Tq();
            Out ref(c, padded);
            REQUIRE(merge(ptrs(s), T, c.H, c.Dv, dt, ref.o, ref.lse.data()) == RINGATTN_SUCCESS);
            Partial &p0 = s.parts[0];
            INFO("dtype " << dtype_name(dt) << " padded " << padded);
            REQUIRE(merge(ptrs(s), T, c.H, c.Dv, dt, p0.o, p0.lse.data()) == RINGATTN_SUCCESS);
            CHECK(std::memcmp(ref.lse.data(), p0.lse.data(), (size_t)(c.H * T) * sizeof(float)) == 0);
            bool same = true;
            for (int64_t t = 0; t < T; ++t)
                for (int h = 0; h < c.H; ++h)
                    for (int cc = 0; cc < c.Dv; ++cc) same = same && ref.o.bits(t, h, cc) == p0.o.bits(t, h, cc);
            CHECK(same);
        }
}

TEST_CASE("merge of library partials over split key sets equals one library pass", "[merge]")
{
    // No mask: attention over keys [0, a) and [a, L) of every sequence, merged, is attention
    // over [0, L). The key split may leave a part empty (a = 0 or a = L).
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int rep = 0; rep < 3; ++rep) {
            std::mt19937_64 rng(seed_for("merge-library", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 4;
            c.Hkv = rep == 2 ? 1 : 2;
            c.D = 32;
            c.Dv = 24;
            std::vector<int> lq, lk, la, lb;
            for (int i = 0; i < 3; ++i) {
                const int q = 1 + (int)(rng() % 50), k = (int)(rng() % 120);
                const int a = i == 0 ? 0 : (i == 1 ? k : (int)(rng() % (uint64_t)(k + 1)));
                lq.push_back(q);
                lk.push_back(k);
                la.push_back(a);
                lb.push_back(k - a);
            }
            c.cu_q = cu_from_lengths(lq);
            c.cu_k = cu_from_lengths(lk);
            Problem full(c, Storage::Packed, rng);
            AttnConfig ca = c, cb = c;
            ca.cu_k = cu_from_lengths(la);
            cb.cu_k = cu_from_lengths(lb);
            Problem pa(ca, Storage::Packed, rng), pb(cb, Storage::Packed, rng);
            pa.q = full.q;
            pb.q = full.q;
            // copy the key rows of each part from the full problem
            for (int sq = 0; sq < 3; ++sq)
                for (int j = 0; j < lk[(size_t)sq]; ++j) {
                    const bool in_a = j < la[(size_t)sq];
                    Problem &dst = in_a ? pa : pb;
                    const int64_t row = (in_a ? ca.cu_k[(size_t)sq] + j : cb.cu_k[(size_t)sq] + j - la[(size_t)sq]);
                    const int64_t src = c.cu_k[(size_t)sq] + j;
                    for (int h = 0; h < c.hkv(); ++h) {
                        for (int cc = 0; cc < c.D; ++cc) dst.k.set(row, h, cc, full.k.get(src, h, cc));
                        for (int cc = 0; cc < c.Dv; ++cc) dst.v.set(row, h, cc, full.v.get(src, h, cc));
                    }
                }
            Plan plan_full(c), plan_a(ca), plan_b(cb);
            REQUIRE(plan_full.ok());
            REQUIRE(plan_a.ok());
            REQUIRE(plan_b.ok());
            full.poison_forward_outputs();
            pa.poison_forward_outputs();
            pb.poison_forward_outputs();
            REQUIRE(run_forward(plan_full, full) == RINGATTN_SUCCESS);
            REQUIRE(run_forward(plan_a, pa) == RINGATTN_SUCCESS);
            REQUIRE(run_forward(plan_b, pb) == RINGATTN_SUCCESS);
            Partial A{pa.o, pa.lse}, B{pb.o, pb.lse};
            const int64_t T = c.Tq();
            Out out(c, false);
            REQUIRE(merge({&A, &B}, T, c.H, c.Dv, dt, out.o, out.lse.data()) == RINGATTN_SUCCESS);
            INFO("config: " << c.describe());
            const FwdResult ref = oracle_forward(c, full.q.to_dense(), full.k.to_dense(), full.v.to_dense());
            const std::vector<double> lse_m(out.lse.begin(), out.lse.begin() + (ptrdiff_t)(c.H * T));
            const std::vector<double> lse_f(full.lse.begin(), full.lse.begin() + (ptrdiff_t)(c.H * T));
            const double e_merged = spec_err(out.o.to_dense(), ref.O, ref.O_mag);
            const double e_full = spec_err(full.o.to_dense(), ref.O, ref.O_mag);
            const double lim = f32_limit_out(ref.max_logit);
            CHECK(!out.o.any_nonfinite());
            if (dt == RINGATTN_FLOAT32) {
                CHECK(e_merged <= lim);
                CHECK(spec_lse_err(lse_m, ref.lse) <= lim);
            } else {
                // Two roundings to the half dtype (the partials, then the merge) instead of
                // one: the merged result is allowed twice the single-pass allowance (4x plain).
                const FwdResult plain = plain_forward(c, full.q.to_dense(), full.k.to_dense(), full.v.to_dense());
                const double e_plain = spec_err(plain.O, ref.O, ref.O_mag);
                CHECK(e_full <= std::max(2 * e_plain, lim));
                CHECK(e_merged <= std::max(4 * e_plain, lim));
                CHECK(spec_lse_err(lse_m, ref.lse) <= std::max(2 * spec_lse_err(plain.lse, ref.lse), lim));
            }
            CHECK(spec_lse_err(lse_f, ref.lse) <= lim);
        }
}

TEST_CASE("merge rejects bad arguments and leaves its outputs untouched", "[merge][validation]")
{
    std::mt19937_64 rng(seed_for("merge-bad", 0));
    Split s = make_split(rng, RINGATTN_FLOAT32, 2, false, 0.0);
    const AttnConfig &c = s.cfg;
    const int64_t T = c.Tq();
    REQUIRE(T > 0);
    std::vector<ringattn_tensor_t> os = {s.parts[0].o.host_desc(), s.parts[1].o.host_desc()};
    std::vector<const float *> ls = {s.parts[0].lse.data(), s.parts[1].lse.data()};
    Out out(c, false);
    for (int h = 0; h < c.H; ++h)
        for (int64_t t = 0; t < T; ++t)
            for (int cc = 0; cc < c.Dv; ++cc) out.o.set(t, h, cc, 0.25 * (double)cc - t);
    std::fill(out.lse.begin(), out.lse.end(), 3.5f);
    const auto o_before = snapshot(out.o);
    const auto lse_before = out.lse;

    struct Bad {
        const char *what;
        std::function<ringattn_status_t()> call;
    };
    auto call = [&](int n, int64_t t, int h, int dv, ringattn_dtype_t dt, const ringattn_tensor_t *po,
                    const float *const *pl, ringattn_tensor_t oo, float *ol) {
        return ringattn_merge_partials(n, t, h, dv, dt, po, pl, oo, ol);
    };
    ringattn_tensor_t null_out = out.o.host_desc();
    null_out.data = nullptr;
    ringattn_tensor_t neg_stride = out.o.host_desc();
    neg_stride.row_stride = -1;
    std::vector<ringattn_tensor_t> os_null = os;
    os_null[1].data = nullptr;
    std::vector<const float *> ls_null = ls;
    ls_null[1] = nullptr;
    std::vector<ringattn_tensor_t> os_short = os;
    os_short[0].head_stride = 1; // head stride < dim (and dim > 1 below)
    const Bad cases[] = {
        {"num_partials 0", [&] { return call(0, T, c.H, c.Dv, c.dtype, os.data(), ls.data(), out.o.host_desc(), out.lse.data()); }},
        {"num_partials -1", [&] { return call(-1, T, c.H, c.Dv, c.dtype, os.data(), ls.data(), out.o.host_desc(), out.lse.data()); }},
        {"num_tokens -1", [&] { return call(2, -1, c.H, c.Dv, c.dtype, os.data(), ls.data(), out.o.host_desc(), out.lse.data()); }},
        {"num_heads 0", [&] { return call(2, T, 0, c.Dv, c.dtype, os.data(), ls.data(), out.o.host_desc(), out.lse.data()); }},
        {"head_dim_v 0", [&] { return call(2, T, c.H, 0, c.dtype, os.data(), ls.data(), out.o.host_desc(), out.lse.data()); }},
        {"bad dtype", [&] { return call(2, T, c.H, c.Dv, (ringattn_dtype_t)7, os.data(), ls.data(), out.o.host_desc(), out.lse.data()); }},
        {"NULL parts_o", [&] { return call(2, T, c.H, c.Dv, c.dtype, nullptr, ls.data(), out.o.host_desc(), out.lse.data()); }},
        {"NULL parts_lse", [&] { return call(2, T, c.H, c.Dv, c.dtype, os.data(), nullptr, out.o.host_desc(), out.lse.data()); }},
        {"NULL parts_lse[1]", [&] { return call(2, T, c.H, c.Dv, c.dtype, os.data(), ls_null.data(), out.o.host_desc(), out.lse.data()); }},
        {"NULL parts_o[1].data", [&] { return call(2, T, c.H, c.Dv, c.dtype, os_null.data(), ls.data(), out.o.host_desc(), out.lse.data()); }},
        {"NULL out_o.data", [&] { return call(2, T, c.H, c.Dv, c.dtype, os.data(), ls.data(), null_out, out.lse.data()); }},
        {"NULL out_lse", [&] { return call(2, T, c.H, c.Dv, c.dtype, os.data(), ls.data(), out.o.host_desc(), nullptr); }},
        {"negative out stride", [&] { return call(2, T, c.H, c.Dv, c.dtype, os.data(), ls.data(), neg_stride, out.lse.data()); }},
    };
    for (const Bad &b : cases) {
        INFO(b.what);
        const ringattn_status_t st = b.call();
        CHECK(st == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(std::strstr(ringattn_last_error(), "ringattn_merge_partials") != nullptr);
        CHECK(out.o.buf->bytes == o_before);
        CHECK(std::memcmp(out.lse.data(), lse_before.data(), lse_before.size() * sizeof(float)) == 0);
    }
    if (c.Dv > 1 && c.H > 1) {
        INFO("parts_o[0] head stride smaller than head_dim_v");
        CHECK(call(2, T, c.H, c.Dv, c.dtype, os_short.data(), ls.data(), out.o.host_desc(), out.lse.data()) ==
              RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(out.o.buf->bytes == o_before);
    }
}
