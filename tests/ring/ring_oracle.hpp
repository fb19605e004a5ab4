// The float64 oracle (support/oracle.hpp) applied to a ring Problem: the gradient magnitudes that
// floor the ring-vs-single comparisons where the exact gradient cancels (compare.hpp), and the
// oracle's own outputs where a ring test checks a property directly.
#pragma once

#include "ring/compare.hpp"
#include "ring/ring_harness.hpp"
#include "support/oracle.hpp"

namespace ringtest {

// The AttnConfig and dense float64 inputs of pb (its stored values, i.e. after rounding to
// pb.dtype; Q = K = the same tokens, delta = 0, scale = 1/sqrt(D)).
ratest::AttnConfig oracle_config(const Problem &pb);
void oracle_inputs(const Problem &pb, ratest::Dense &Q, ratest::Dense &K, ratest::Dense &V,
                   ratest::Dense &dO);

// GRAD_MAG_FLOOR (1%) of the largest magnitude of each gradient (oracle_backward_magnitude).
GradFloors magnitude_floors(const Problem &pb);

// max |O of r - oracle O| / max |oracle O| (global order, both [T, H, D_v]).
double o_vs_oracle(const Problem &pb, const Result &r);

} // namespace ringtest
