// SPEC 10 case 10, clause by clause, checked directly (not through the oracle's selection).
// (Dynamic mask attention, SPEC 6; the helpers are in dynamic_common.hpp.)
#include "unit/dynamic_common.hpp"

using namespace dyntest;


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
            c.Dv = backend_dim(1);
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
        for (MaskKind m : all_masks)
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
                    check_same_forward(got, ref);
                    check_same_backward(got, ref);
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
