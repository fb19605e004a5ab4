// Judging ring results: against the float64 oracle under SPEC 9 (support/spec9.hpp), the same
// judgement as the single-rank tests', and bitwise between runs. Catch2 assertions.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ring/ring_harness.hpp"
#include "support/spec9.hpp"

namespace ringtest {

inline const ringattn_layout_t all_layouts[] = {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_ZIGZAG,
                                                RINGATTN_LAYOUT_STRIPED};

// The oracle's references of pb, computed once for any number of results of it.
inline ratest::Spec9 judge_of(const ratest::Problem &pb)
{
    return ratest::Spec9(pb.cfg, pb.q.to_dense(), pb.k.to_dense(), pb.v.to_dense(),
                         pb.dout.to_dense());
}

// r succeeded, and its outputs and gradients are within SPEC 9 of the oracle (exact_logits:
// at the plain limits, support/spec9.hpp).
inline bool check_result(const Result &r, const ratest::Spec9 &judge, const ratest::Problem &pb,
                         const std::string &label, bool exact_logits = false)
{
    INFO(label << ": " << pb.cfg.describe());
    REQUIRE(r.status == RINGATTN_SUCCESS);
    ratest::Spec9Options opt;
    opt.label = label;
    opt.exact_logits = exact_logits;
    return judge.check(r.got(pb.cfg), opt);
}

// The ring at every P in `ranks` under every layout (opt: its comm, say), each within SPEC 9
// of the oracle; with_single: first the single-rank plan (exact_logits: at the plain limits).
inline void check_every_layout(const ratest::Problem &pb, const std::vector<int> &ranks,
                               const RunOptions &opt = RunOptions(), bool with_single = true,
                               bool exact_logits = false)
{
    const ratest::Spec9 judge = judge_of(pb);
    if (with_single)
        check_result(run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS), judge, pb, "single rank",
                     exact_logits);
    for (ringattn_layout_t layout : all_layouts)
        for (int n : ranks)
            check_result(run(pb, n, layout, opt), judge, pb,
                         "ring, layout " + std::to_string(layout) + ", ranks " + std::to_string(n),
                         exact_logits);
}

inline bool same_bits(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Two runs of the same problem bitwise equal: O, LSE, dQ, dK, dV and, where there is one, dBias
// (one CHECK each).
inline void check_bitwise_same(const Result &a, const Result &b)
{
    CHECK(same_bits(a.o, b.o));
    CHECK(same_bits(a.lse, b.lse));
    CHECK(same_bits(a.dq, b.dq));
    CHECK(same_bits(a.dk, b.dk));
    CHECK(same_bits(a.dv, b.dv));
    if (!a.dbias.empty()) CHECK(same_bits(a.dbias, b.dbias));
}

// SPEC 9's O error of r against the oracle of config c (another problem's, say: a selection
// that must matter) with pb's inputs.
inline double o_error(const ratest::AttnConfig &c, const ratest::Problem &pb, const Result &r)
{
    const ratest::FwdResult f =
        ratest::oracle_forward(c, pb.q.to_dense(), pb.k.to_dense(), pb.v.to_dense());
    return ratest::spec_err(r.got(pb.cfg).O, f.O, f.O_mag);
}

} // namespace ringtest
