// Shared helpers of the dynamic mask tests (test_dynamic_*.cpp): random configurations of
// SPEC 6 (bias heads, keep_k, masks). Running a case against the float64 oracle and comparing
// two runs bitwise are in support/cases.hpp. Header-only; each test file includes it once.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "support/cases.hpp"
#include "support/shim.hpp"

namespace dyntest {

using namespace ratest;


// The masks the dynamic tests cycle through (not HugeWindow or Narrow).
const MaskKind all_masks[] = {MaskKind::None, MaskKind::Causal, MaskKind::Window, MaskKind::CausalWindow};

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
    set_random_keys(c, lq, rng);
    set_mask(c, all_masks[(size_t)(it % 4)], rng);
    set_random_logit_options(c, rng);
    c.key_bias_heads = bias_heads(c, it % 3);
    c.keep_k = keep_choice(c, (it / 3) % 5, rng);
    c.num_threads = pick(rng, {1, 2});
    return c;
}

} // namespace dyntest
