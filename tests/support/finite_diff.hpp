// SPEC 10 case 8: finite differences in float64 through the oracle. Central differences of the
// loss L = sum(O * G) of the oracle's forward with respect to Q, K, V and the key bias, the small
// problems they run on, and the larger problems of the same kind that the library is checked on.
// Shared by test_finite_diff.cpp (no bias) and test_dynamic_fd.cpp (dBias, SPEC 6).
// Header-only.
#pragma once

#include <random>
#include <vector>

#include "support/device.hpp"
#include "support/shim.hpp"

namespace ratest {

inline Dense random_dense(std::mt19937_64 &rng, int64_t T, int H, int D, double sigma)
{
    Dense d(T, H, D);
    std::normal_distribution<double> nd(0.0, sigma);
    for (double &x : d.v) x = nd(rng);
    return d;
}

inline double fd_loss(const AttnConfig &c, const Dense &Q, const Dense &K, const Dense &V, const Dense &G)
{
    const FwdResult r = oracle_forward(c, Q, K, V);
    double L = 0;
    for (size_t i = 0; i < G.v.size(); ++i) L += r.O.v[i] * G.v[i];
    return L;
}

// Step h: truncation O(h^2) ~ 1e-10 and cancellation ~ 1e-16 / h ~ 1e-11, relative to O(1)
// values, so the differences agree with an exact gradient to about 1e-10.
constexpr double FD_STEP = 1e-5;

// (loss(x + h e_i) - loss(x - h e_i)) / 2h for every element i of `x`, which `loss` reads (x is
// restored after each element).
template <class Loss> std::vector<double> central_differences(std::vector<double> &x, const Loss &loss)
{
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + FD_STEP;
        const double lp = loss();
        x[i] = x0 - FD_STEP;
        const double lm = loss();
        x[i] = x0;
        g[i] = (lp - lm) / (2 * FD_STEP);
    }
    return g;
}

// dL/dx by central differences, `x` being one of Q, K, V.
inline Dense numeric_grad(const AttnConfig &c, Dense &Q, Dense &K, Dense &V, const Dense &G, Dense &x)
{
    Dense g(x.T, x.heads, x.dim);
    g.v = central_differences(x.v, [&] { return fd_loss(c, Q, K, V, G); });
    return g;
}

// dL/dBias by central differences: Dense(H_b, 1, T_k), no elements without a bias.
inline Dense numeric_dbias(AttnConfig c, const Dense &Q, const Dense &K, const Dense &V, const Dense &G)
{
    Dense g(c.key_bias_heads, 1, c.Tk());
    g.v = central_differences(c.bias, [&] { return fd_loss(c, Q, K, V, G); });
    return g;
}

// One finite-difference case: the mask and logit options, heads, and (dynamic masks) H_b and
// keep_k.
struct FdCase {
    const char *name;
    bool causal;
    int wl, wr;
    float softcap;
    bool alibi;
    float scale;
    int H, Hkv;
    int Hb = 0, keep_k = 0;
};

// size 0: the finite-difference shape, D = 6, D_v = 5 (8 and 8 on CUDA: backend_dim), query
// lengths 7, 6, 1 and key lengths 7, 3, 2 (sequence 1 has fewer keys than queries, so with causal
// masks some rows are empty).
// size 1: a larger problem of the same kind for the library, D = 48, D_v = 40, lengths 90, 60, 1
// and 90, 30, 70, tiles 32 x 16 and keep_k 4 times the case's. No bias values (c.bias) yet.
inline AttnConfig fd_config(const FdCase &fc, int size)
{
    AttnConfig c;
    c.H = fc.H;
    c.Hkv = fc.Hkv;
    c.D = size == 0 ? backend_dim(6) : 48;
    c.Dv = size == 0 ? backend_dim(5) : 40;
    c.cu_q = cu_from_lengths(size == 0 ? std::vector<int>{7, 6, 1} : std::vector<int>{90, 60, 1});
    c.cu_k = cu_from_lengths(size == 0 ? std::vector<int>{7, 3, 2} : std::vector<int>{90, 30, 70});
    c.causal = fc.causal;
    c.wl = fc.wl;
    c.wr = fc.wr;
    c.softcap = fc.softcap;
    if (fc.alibi) c.alibi = alibi_slopes(c.H);
    c.scale = fc.scale;
    c.key_bias_heads = fc.Hb;
    c.keep_k = size == 0 ? fc.keep_k : 4 * fc.keep_k;
    if (size == 1) c.block_q = 32, c.block_k = 16;
    return c;
}

// Q and K from N(0, sigma) with sigma 2 under a softcap (to reach the curved part of tanh),
// else 1.
inline double fd_sigma_qk(const FdCase &fc) { return fc.softcap > 0 ? 2.0 : 1.0; }

// The oracle's gradients of one small case and their central differences: random inputs (Q and
// K from N(0, sigma_qk), V and G from N(0, 1), drawn in that order), the oracle's forward and its
// backward for dO = G, and the differences for Q, K, V and the bias (empty without one).
struct FdGradients {
    Dense Q, K, V, G;
    FwdResult fwd;
    BwdResult oracle;
    Dense nq, nk, nv, nbias;
};

inline FdGradients fd_gradients(const AttnConfig &c, std::mt19937_64 &rng, double sigma_qk)
{
    FdGradients r;
    r.Q = random_dense(rng, c.Tq(), c.H, c.D, sigma_qk);
    r.K = random_dense(rng, c.Tk(), c.hkv(), c.D, sigma_qk);
    r.V = random_dense(rng, c.Tk(), c.hkv(), c.dv(), 1.0);
    r.G = random_dense(rng, c.Tq(), c.H, c.dv(), 1.0);
    r.fwd = oracle_forward(c, r.Q, r.K, r.V);
    r.oracle = oracle_backward(c, r.Q, r.K, r.V, r.fwd.O, r.fwd.lse, r.G);
    r.nbias = numeric_dbias(c, r.Q, r.K, r.V, r.G);
    r.nq = numeric_grad(c, r.Q, r.K, r.V, r.G, r.Q);
    r.nk = numeric_grad(c, r.Q, r.K, r.V, r.G, r.K);
    r.nv = numeric_grad(c, r.Q, r.K, r.V, r.G, r.V);
    return r;
}

} // namespace ratest
