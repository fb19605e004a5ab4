// Host tensors for the tests: typed storage (float32 / float16 / bfloat16) with arbitrary row and
// head strides, views that share one buffer (QKV interleaved), NaN poisoning, and dense float64
// copies for the oracle.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "ringattn.h"
#include "support/device.hpp"
#include "support/half.hpp"

namespace ratest {

size_t dtype_size(ringattn_dtype_t dt);
const char *dtype_name(ringattn_dtype_t dt);
// Value of `x` after storage in `dt` (round to nearest even), as a double.
double round_to_dtype(double x, ringattn_dtype_t dt);

// Dense float64 [T, heads, dim] (or [heads, T] for LSE-like data, with dim = 1).
struct Dense {
    int64_t T = 0;
    int heads = 0, dim = 0;
    std::vector<double> v;
    Dense() = default;
    Dense(int64_t t, int h, int d) : T(t), heads(h), dim(d), v((size_t)(t * h * d), 0.0) {}
    double &at(int64_t t, int h, int c) { return v[(size_t)((t * heads + h) * dim + c)]; }
    double at(int64_t t, int h, int c) const { return v[(size_t)((t * heads + h) * dim + c)]; }
    const double *row(int64_t t, int h) const { return &v[(size_t)((t * heads + h) * dim)]; }
    double *row(int64_t t, int h) { return &v[(size_t)((t * heads + h) * dim)]; }
};

// Host bytes of dtype elements, and their copy for the backend under test (support/device.hpp).
struct Buffer {
    ringattn_dtype_t dtype = RINGATTN_FLOAT32;
    std::vector<unsigned char> bytes;
    size_t elems = 0;
    Mirror dev;
    Buffer(ringattn_dtype_t dt, size_t n);
    void *ptr(int64_t elem) { return bytes.data() + (size_t)elem * dtype_size(dtype); }
    // The backend's copy of element elem onwards, written from the host bytes now.
    void *device(int64_t elem)
    {
        return static_cast<unsigned char *>(dev.bind(bytes.data(), bytes.size())) +
               (size_t)elem * dtype_size(dtype);
    }
    void fill_nan();
};

// A [T, heads, dim] view into a Buffer: element (t, h, c) at off + t * rs + h * hs + c.
struct TView {
    std::shared_ptr<Buffer> buf;
    int64_t off = 0, T = 0;
    int heads = 0, dim = 0;
    int64_t rs = 0, hs = 0;
    bool zero_strides = false; // pass strides 0 ("packed") to the library

    bool empty_alloc() const { return !buf; }
    int64_t index(int64_t t, int h, int c) const { return off + t * rs + h * hs + c; }
    double get(int64_t t, int h, int c) const;
    void set(int64_t t, int h, int c, double x); // rounds to the buffer's dtype
    void set_nan(int64_t t, int h, int c);
    void poison();                              // every logical element := NaN
    ringattn_tensor_t desc() const;      // the backend's copy (host memory for the CPU), bound now
    ringattn_tensor_t host_desc() const; // the host bytes (host-memory APIs: merge, scatter)
    Dense to_dense() const;
    void from_dense(const Dense &d); // rounds
    bool any_nonfinite() const;
    uint64_t bits(int64_t t, int h, int c) const; // raw stored bits (for bitwise comparisons)
};

// Packed [T, heads, dim]; zero_strides selects passing 0/0 or the explicit packed strides.
TView make_packed(ringattn_dtype_t dt, int64_t T, int heads, int dim, bool zero_strides = false);
// Padded: head stride dim + head_pad, row stride heads * hs + row_pad. Padding is NaN.
TView make_padded(ringattn_dtype_t dt, int64_t T, int heads, int dim, int head_pad, int row_pad);
// Three views interleaved per token in one buffer: [a(heads_a*dim_a) | b | c | row_pad].
void make_interleaved(ringattn_dtype_t dt, int64_t T, int ha, int da, int hb, int db, int hc,
                      int dc, int row_pad, TView &a, TView &b, TView &c);

// Byte snapshot of a buffer, and a check that every element NOT covered by any of `views`
// (which must all live in that buffer) is bitwise unchanged.
std::vector<unsigned char> snapshot(const TView &v);
bool padding_unchanged(const std::vector<unsigned char> &before,
                       const std::vector<const TView *> &views);

// Random fill: normal(0, sigma) rounded to the view's dtype.
void fill_normal(TView &v, std::mt19937_64 &rng, double sigma = 1.0);

// Seed derived from a test name and a case index (fixed per case, different between cases;
// RATEST_SEED=any string draws another fixed set, to search the inputs for a failing case).
uint64_t seed_for(const char *name, uint64_t index);

} // namespace ratest
