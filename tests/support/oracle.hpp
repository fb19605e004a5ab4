// The float64 dense oracle of SPEC 2-4 and 7, and the "plain same-precision implementation" that
// SPEC 9's half-precision tolerance rule compares against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ringattn.h"
#include "support/tensor.hpp"

namespace ratest {

// Everything that defines the attention problem (mirrors ringattn_plan_desc_t; 0 = default where
// the descriptor says so).
struct AttnConfig {
    int H = 1, Hkv = 0, D = 16, Dv = 0;
    ringattn_dtype_t dtype = RINGATTN_FLOAT32;
    std::vector<int32_t> cu_q;  // [num_seqs + 1]
    std::vector<int32_t> cu_k;  // empty: same as cu_q
    bool causal = false;
    int wl = -1, wr = -1;
    float scale = 0.0f;   // 0: 1/sqrt(D)
    float softcap = 0.0f; // 0: off
    std::vector<float> alibi; // empty: no ALiBi, else [H]
    // The CPU backend's tiles (ringattn.h): a plan for another backend is made with 0/0, its
    // kernels' own tiles, so that one case runs on every backend; cpu_tiles_everywhere keeps
    // them (the CUDA backend's refusal of other tiles).
    int block_q = 0, block_k = 0, num_threads = 0;
    bool cpu_tiles_everywhere = false;
    ringattn_layout_t layout = RINGATTN_LAYOUT_CONTIGUOUS; // only meaningful with a comm (SPEC 8)
    // Dynamic mask attention (SPEC 6): key_bias_heads = H_b (0: no bias; else 1, Hkv or H),
    // keep_k (0: no selection) and the bias itself, [H_b, Tk] row-major: bias[hb * Tk + j]. The
    // values are doubles so that finite differences can perturb them; the library is given them
    // as float32 (Problem rounds them first, so the oracle sees exactly what the library sees).
    int key_bias_heads = 0, keep_k = 0;
    std::vector<double> bias;
    // SPEC 9's level for the half dtypes: the default judges against a plain flash
    // implementation (P and dS rounded to the storage dtype), HIGH against a plain one
    ringattn_precision_t precision = RINGATTN_PRECISION_DEFAULT;
    // SPEC 11: sink logits [H] (empty: none; -inf: none for that head) and the LSE's gradient
    // [H * Tq] (empty: zero), float32 values as doubles (the library is given them as float).
    std::vector<double> sinks, dlse;

    int hkv() const { return Hkv ? Hkv : H; }
    int dv() const { return Dv ? Dv : D; }
    int num_seqs() const { return (int)cu_q.size() - 1; }
    const std::vector<int32_t> &cuk() const { return cu_k.empty() ? cu_q : cu_k; }
    int64_t Tq() const { return cu_q.empty() ? 0 : cu_q.back(); }
    int64_t Tk() const { return cuk().empty() ? 0 : cuk().back(); }
    double eff_scale() const;
    int eff_wr() const { return causal ? 0 : wr; }
    bool has_bias() const { return key_bias_heads > 0; }
    int bias_head(int h) const { return h / (H / key_bias_heads); } // query head -> bias head
    double bias_at(int h, int64_t j) const { return bias[(size_t)(bias_head(h) * Tk() + j)]; }
    std::string describe() const;
};

// Optional restriction of the key set (merge tests): key_on[j] for global key index j.
using KeyFilter = std::vector<char>;

struct FwdResult {
    Dense O;                 // [Tq, H, Dv]
    std::vector<double> lse; // [H * Tq], -inf for rows with no allowed key
    Dense O_mag;             // SPEC 9's A_O: O's sums over |terms|, sum_j P_ij |v_j|
    double max_logit = 0;    // SPEC 9's S: max |s_ij| over the pairs SPEC 3 allows
};

struct BwdResult {
    Dense dQ, dK, dV;
    Dense dBias; // Dense(H_b, 1, Tk): v[hb * Tk + j]; empty (no elements) without a bias
    Dense dSinks; // Dense(1, H, 1) (SPEC 11); empty without sinks
};

// SPEC 2-4 in float64 on dense inputs (Q [Tq,H,D], K [Tk,Hkv,D], V [Tk,Hkv,Dv]).
FwdResult oracle_forward(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V,
                         const KeyFilter *keys = nullptr);
// SPEC 6: the global key indices that query token `i` (global index into cu_q) of head `h` keeps:
// its valid keys (SPEC 3) when keep_k = 0 or it has at most keep_k of them, else the keep_k of
// largest bias, ties to the lower position. Sorted ascending. (The forward and backward below
// use the same selection.)
std::vector<int64_t> oracle_kept_keys(const AttnConfig &cfg, int64_t i, int h);

// SPEC 7 in float64, from the given O and LSE (normally the oracle's own).
BwdResult oracle_backward(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V,
                          const Dense &O, const std::vector<double> &lse, const Dense &dO);

// The same backward over magnitudes: every sum of SPEC 7 taken over the absolute values of its
// terms (dS -> P * (|dO|.|v| + |dO|.|O|), dQ -> |scale| sum |dZ| |k|, ...). It is the size of what
// float arithmetic adds up, i.e. the scale of the rounding error, whatever the cancellation.
BwdResult oracle_backward_magnitude(const AttnConfig &cfg, const Dense &Q, const Dense &K,
                                    const Dense &V, const Dense &O, const std::vector<double> &lse,
                                    const Dense &dO);

// The plain same-precision implementation of SPEC 9: dense softmax over the stored (already
// rounded) inputs with float32 arithmetic and accumulation; O, dQ, dK, dV rounded to cfg.dtype at
// the end, LSE kept in float32, dBias float32 (its storage type in every dtype). Its backward uses
// its own rounded O and float32 LSE. At cfg.precision DEFAULT it is the plain *flash*
// implementation: as FlashAttention, P (exp(s - m) in the forward, normalised by the float32 row
// sum after the product; exp(s - LSE) in the backward) and dS (after the softcap's derivative)
// are rounded to cfg.dtype before the products that read them.
FwdResult plain_forward(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V);
BwdResult plain_backward(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V,
                         const Dense &O, const std::vector<double> &lse, const Dense &dO);

// Plain relative errors, for comparisons that are not SPEC 9's (finite differences, the
// oracle's own checks): max|got - ref| / max|ref|, and ||got - ref||_2 / ||ref||_2 (0 when both
// are all zero, +inf when only ref is).
double max_rel_err(const Dense &got, const Dense &ref);
double norm_rel_err(const Dense &got, const Dense &ref);

// SPEC 9's norms (support/spec9.hpp applies them): for an output or gradient G,
// max|G - G_ref| / max(max|G_ref|, 0.1 max A_G), A_G the same sums over |terms| (mag), so that
// a reference that vanishes by cancellation is not divided by (almost) zero; for LSE,
// max_i |L_i - L_ref,i| / max(1, |L_ref,i|) over rows with a finite reference (the tests require
// the others to be exactly -inf). NaN in got gives NaN.
double spec_err(const Dense &got, const Dense &ref, const Dense &mag);
double spec_lse_err(const std::vector<double> &got, const std::vector<double> &ref);

} // namespace ratest
