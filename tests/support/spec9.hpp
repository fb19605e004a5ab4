// SPEC 9, applied: a problem's outputs judged against the float64 oracle. Every test that
// compares with the oracle -- one rank (support/shim.cpp), the ring over threads and over MPI
// -- goes through here, so they all use the same norms and limits:
//   float32:  O and LSE within 1e-5 max(1, S/16), gradients within 1e-4 max(1, S/16), where S is
//             the largest |logit| of the problem (float32 rounding of the logits costs ulp(S));
//   float16 / bfloat16: at most 2x the error of the plain same-precision implementation (at
//             the default level a plain *flash* one, rounding P and dS to the storage dtype;
//             cfg.precision HIGH: without that rounding; oracle.hpp), and never below the
//             float32 limit.
#pragma once

#include <string>
#include <vector>

#include "support/oracle.hpp"

namespace ratest {

double f32_limit_out(double max_logit);  // O and LSE
double f32_limit_grad(double max_logit); // dQ, dK, dV, dBias

// What an implementation returned, as float64 (empty Dense: not computed, not judged).
struct Got {
    Dense O;
    std::vector<double> lse;
    Dense dQ, dK, dV, dBias, dSinks;
};

struct Spec9Options {
    bool backward = true;
    // The limit of every comparison at the plain float32 rule (S taken as 0): for problems
    // whose logits are exact in float32, where a larger error is a real one.
    bool exact_logits = false;
    std::string label; // for the messages
};

// The references of one problem (the oracle, its magnitudes, the plain implementation for the
// half dtypes), computed once, and the judgement of any number of results against them.
class Spec9 {
  public:
    Spec9(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V, const Dense &dO,
          bool backward = true);
    // CHECKs (Catch2) each error against its limit; false when one fails. RATEST_REPORT=1
    // prints every error next to its limit.
    bool check(const Got &got, const Spec9Options &opt = Spec9Options()) const;
    const FwdResult &forward() const { return ref_; }
    const BwdResult &magnitudes() const { return mag_; }

  private:
    AttnConfig cfg_;
    FwdResult ref_, plain_;
    BwdResult grad_, mag_, plain_grad_;
    bool backward_;
};

// Spec9(...).check(got, opt), for a problem judged once.
bool spec9_check(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V,
                 const Dense &dO, const Got &got, const Spec9Options &opt = Spec9Options());

} // namespace ratest
