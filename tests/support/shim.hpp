// A thin C++ shim over the ringattn C API for the tests: RAII plan, a problem holding its host
// tensors, forward/backward runners that return the status, and the SPEC 9 comparison against the
// float64 oracle (Catch2 assertions).
#pragma once

#include <random>
#include <string>
#include <vector>

#include "ringattn.h"
#include "support/oracle.hpp"
#include "support/tensor.hpp"

namespace ratest {

// The descriptor of cfg for the backend under test (support/device.hpp); points into cfg.
ringattn_plan_desc_t make_desc(const AttnConfig &cfg);

class Plan {
  public:
    Plan() = default;
    explicit Plan(const AttnConfig &cfg) { create(cfg); }
    ~Plan() { reset(); }
    Plan(const Plan &) = delete;
    Plan &operator=(const Plan &) = delete;
    ringattn_status_t create(const AttnConfig &cfg);
    void reset();
    ringattn_plan_t get() const { return p_; }
    ringattn_status_t status() const { return st_; }
    bool ok() const { return p_ != nullptr && st_ == RINGATTN_SUCCESS; }

  private:
    ringattn_plan_t p_ = nullptr;
    ringattn_status_t st_ = RINGATTN_ERR_INTERNAL;
};

// How the problem's tensors are laid out in memory.
enum class Storage {
    Packed,      // explicit packed strides
    PackedZero,  // strides passed as 0 (the library's "packed")
    Padded,      // head and row padding (NaN-filled, must never be read or written)
    Interleaved, // Q|K|V in one buffer per token and dQ|dK|dV in another (needs Tq == Tk)
    // Padded with Q, K, V padding of whole 16-byte chunks (the CUDA kernels load those; O, dO
    // and the gradients keep odd padding)
    PaddedAligned,
    InterleavedAligned, // Interleaved with a row padding of one 16-byte chunk
};

struct Problem {
    AttnConfig cfg;
    TView q, k, v, o, dout, dq, dk, dv;
    std::vector<float> lse; // [H, Tq]
    // Key bias (SPEC 6), when cfg.key_bias_heads > 0, as the library sees it: bias_buf holds the
    // H_b * Tk float32 values of cfg.bias followed by BIAS_GUARD NaNs (a read past the end
    // poisons the result); dbias_buf holds H_b * Tk outputs followed by BIAS_GUARD sentinels
    // that must stay as they are. Without a bias both hold only their guards.
    static constexpr size_t BIAS_GUARD = 16;
    static constexpr float DBIAS_SENTINEL = 12345.5f;
    std::vector<float> bias_buf, dbias_buf;
    bool want_dbias = true; // false: tensors().dbias = NULL (not wanted)
    // The backend's copies of lse, bias_buf and dbias_buf (the TViews' buffers have their own).
    Mirror lse_dev, bias_dev, dbias_dev;
    // SPEC 11: cfg.sinks and cfg.dlse as the library sees them (float32, rounded into cfg by
    // the constructor), and dSinks out; each empty (NULL to the library) when cfg's is.
    std::vector<float> sinks_buf, dsinks_buf, dlse_buf;
    Mirror sinks_dev, dsinks_dev, dlse_dev;

    // A bias of cfg.key_bias_heads heads is drawn from N(0, sigma_bias) unless cfg.bias already
    // holds [H_b * Tk] values (then those are used, rounded to float32).
    // On the CUDA backend Padded and Interleaved are their Aligned kinds.
    Problem(const AttnConfig &c, Storage st, std::mt19937_64 &rng, double sigma_qk = 1.0,
            double sigma_bias = 1.0);
    // The tensors as the library takes them: the backend's copies, written from the host now.
    ringattn_tensors_t tensors();
    // Every output back into the host tensors after a call (nothing to do for the CPU).
    void from_device();
    const float *bias_device() { return static_cast<const float *>(bias_dev.bind(bias_buf.data(), bias_buf.size() * sizeof(float))); }
    void poison_forward_outputs();  // O and LSE := NaN
    void poison_backward_outputs(); // dQ, dK, dV, dBias := NaN
    std::vector<double> lse_d() const { return std::vector<double>(lse.begin(), lse.end()); }
    // Replace the bias ([H_b * Tk] values): rounded to float32 into cfg.bias and bias_buf.
    void set_bias(const std::vector<double> &b);
    size_t bias_elems() const { return (size_t)(cfg.key_bias_heads * cfg.Tk()); }
    Dense dbias_dense() const; // Dense(H_b, 1, Tk) of the library's dBias
};

// One call on pb's tensors, its outputs back in pb's host tensors after it.
ringattn_status_t run_forward(const Plan &plan, Problem &pb);
ringattn_status_t run_backward(const Plan &plan, Problem &pb);

struct CheckOptions {
    bool backward = true;
    bool check_determinism = false; // rerun and require bitwise identical outputs
    // The limits of SPEC 9 at S <= 16 (support/spec9.hpp), for problems whose huge logits are
    // exact in float32: scaled by S they would hide real errors.
    bool exact_logits = false;
};

// Poison outputs, run forward (and backward) through the library, compare with the float64
// oracle under SPEC 9 (support/spec9.hpp), check -inf / zero rows, no NaN/inf, untouched inputs
// and padding.
// Returns false if any assertion failed (the assertions themselves are Catch2 CHECKs).
bool check_against_oracle(const Plan &plan, Problem &pb, const CheckOptions &opt = CheckOptions());

// Random AttnConfig helpers.
std::vector<int32_t> cu_from_lengths(const std::vector<int> &lens);
std::vector<float> alibi_slopes(int H); // the usual 2^(-8 h / H) geometric slopes

} // namespace ratest
