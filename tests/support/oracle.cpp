#include "support/oracle.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace ratest {

double AttnConfig::eff_scale() const { return scale != 0.0f ? (double)scale : 1.0 / std::sqrt((double)D); }

std::string AttnConfig::describe() const
{
    std::ostringstream s;
    s << dtype_name(dtype) << " H=" << H << " Hkv=" << hkv() << " D=" << D << " Dv=" << dv()
      << " cu_q={";
    for (size_t i = 0; i < cu_q.size(); ++i) s << (i ? "," : "") << cu_q[i];
    s << "}";
    if (!cu_k.empty()) {
        s << " cu_k={";
        for (size_t i = 0; i < cu_k.size(); ++i) s << (i ? "," : "") << cu_k[i];
        s << "}";
    }
    s << " causal=" << causal << " window=(" << wl << "," << wr << ") scale=" << scale
      << " softcap=" << softcap << " alibi=" << (alibi.empty() ? "off" : "on")
      << " block=(" << block_q << "," << block_k << ") threads=" << num_threads;
    if (key_bias_heads != 0 || keep_k != 0)
        s << " bias_heads=" << key_bias_heads << " keep_k=" << keep_k;
    if (precision == RINGATTN_PRECISION_HIGH) s << " precision=high";
    return s.str();
}

namespace {

const double NEG_INF = -std::numeric_limits<double>::infinity();

// Keys [lo, hi] (positions within the sequence) that query position p may see (SPEC 3); the
// allowed set of one query is an interval. Empty when lo > hi.
void key_range(const AttnConfig &cfg, int64_t p, int64_t delta, int64_t Lk, int64_t &lo,
               int64_t &hi)
{
    const int64_t wr = cfg.eff_wr();
    lo = cfg.wl >= 0 ? std::max<int64_t>(0, p + delta - cfg.wl) : 0;
    hi = wr >= 0 ? std::min<int64_t>(Lk - 1, p + delta + wr) : Lk - 1;
}

void check_bias(const AttnConfig &cfg)
{
    if (cfg.keep_k != 0 && !cfg.has_bias())
        throw std::logic_error("oracle: keep_k needs a key bias");
    if (!cfg.has_bias()) return;
    if (cfg.H % cfg.key_bias_heads != 0 || cfg.bias.size() != (size_t)(cfg.key_bias_heads * cfg.Tk()))
        throw std::logic_error("oracle: key_bias_heads must divide H and bias must hold [H_b, Tk]");
}

// SPEC 6 selection for one row: keep[pj - lo] for the row's valid keys [lo, hi] (positions in
// the sequence whose first key is k0), head h. Every valid key is kept without a selection or
// when the row has at most keep_k valid keys; otherwise the keep_k largest biases, ties to the
// lower position (a stable sort on the bias, descending, of the keys in position order).
void select_keys(const AttnConfig &cfg, int h, int64_t k0, int64_t lo, int64_t hi,
                 std::vector<char> &keep, std::vector<int64_t> &order)
{
    const int64_t n = hi >= lo ? hi - lo + 1 : 0;
    if (cfg.keep_k <= 0 || n <= cfg.keep_k) {
        keep.assign((size_t)n, 1);
        return;
    }
    keep.assign((size_t)n, 0);
    order.resize((size_t)n);
    for (int64_t t = 0; t < n; ++t) order[(size_t)t] = t;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return cfg.bias_at(h, k0 + lo + a) > cfg.bias_at(h, k0 + lo + b);
    });
    for (int64_t t = 0; t < cfg.keep_k; ++t) keep[(size_t)order[(size_t)t]] = 1;
}

// z_raw (before softcap) and s (SPEC 2) in arithmetic R.
template <class R>
void logit(const AttnConfig &cfg, const R *q, const R *k, int h, int64_t p, int64_t delta,
           int64_t pj, R scale, R &z_raw, R &s)
{
    R dot = 0;
    for (int c = 0; c < cfg.D; ++c) dot += q[c] * k[c];
    z_raw = scale * dot;
    if (!std::isfinite(dot)) { // SPEC 9: the scale goes first where the sum would overflow
        dot = 0;
        for (int c = 0; c < cfg.D; ++c) dot += (scale * q[c]) * k[c];
        z_raw = dot;
    }
    R z = z_raw;
    if (cfg.softcap > 0) {
        const R cap = (R)cfg.softcap;
        z = cap * std::tanh(z_raw / cap);
    }
    if (!cfg.alibi.empty()) {
        int64_t dist = p + delta - pj;
        if (dist < 0) dist = -dist;
        z -= (R)cfg.alibi[(size_t)h] * (R)dist;
    }
    s = z;
}

// The logit plus the key bias (SPEC 2: added after softcap and ALiBi, not scaled).
template <class R>
void logit_b(const AttnConfig &cfg, const R *q, const R *k, int h, int64_t p, int64_t delta,
             int64_t pj, int64_t j, R scale, R &z_raw, R &s)
{
    logit<R>(cfg, q, k, h, p, delta, pj, scale, z_raw, s);
    if (cfg.has_bias()) s += (R)cfg.bias_at(h, j);
}

template <class R>
std::vector<R> to_vec(const Dense &d)
{
    return std::vector<R>(d.v.begin(), d.v.end());
}

// x rounded to the storage dtype where round_p (SPEC 9's flash rounding of P and dS).
template <class R> R flash_round(const AttnConfig &cfg, bool round_p, R x)
{
    return round_p ? (R)round_to_dtype((double)x, cfg.dtype) : x;
}

// The plain implementation rounds P and dS at the default level (oracle.hpp).
bool rounds_p(const AttnConfig &cfg)
{
    return cfg.dtype != RINGATTN_FLOAT32 && cfg.precision == RINGATTN_PRECISION_DEFAULT;
}

template <class R>
FwdResult fwd_impl(const AttnConfig &cfg, const Dense &Qd, const Dense &Kd, const Dense &Vd,
                   const KeyFilter *keys, bool round_out, bool round_p = false)
{
    const int H = cfg.H, Hkv = cfg.hkv(), D = cfg.D, Dv = cfg.dv(), G = H / Hkv;
    const int64_t Tq = cfg.Tq();
    const std::vector<R> Q = to_vec<R>(Qd), K = to_vec<R>(Kd), V = to_vec<R>(Vd);
    const R scale = (R)cfg.eff_scale();
    check_bias(cfg);
    std::vector<char> keep;
    std::vector<int64_t> order;
    FwdResult r;
    r.O = Dense(Tq, H, Dv);
    r.O_mag = Dense(Tq, H, Dv);
    r.lse.assign((size_t)(H * Tq), NEG_INF);
    const std::vector<int32_t> &cuk = cfg.cuk();
    std::vector<R> s, acc((size_t)Dv), mag((size_t)Dv);
    for (int sq = 0; sq < cfg.num_seqs(); ++sq) {
        const int64_t q0 = cfg.cu_q[sq], Lq = cfg.cu_q[sq + 1] - q0;
        const int64_t k0 = cuk[sq], Lk = cuk[sq + 1] - k0, delta = Lk - Lq;
        for (int64_t p = 0; p < Lq; ++p) {
            int64_t lo, hi;
            key_range(cfg, p, delta, Lk, lo, hi);
            for (int h = 0; h < H; ++h) {
                const int hk = h / G;
                const R *q = &Q[(size_t)(((q0 + p) * H + h) * D)];
                s.assign(hi >= lo ? (size_t)(hi - lo + 1) : 0, (R)0);
                select_keys(cfg, h, k0, lo, hi, keep, order);
                R m = -std::numeric_limits<R>::infinity();
                bool any = false;
                for (int64_t pj = lo; pj <= hi; ++pj) {
                    const int64_t j = k0 + pj;
                    if (keys && !(*keys)[(size_t)j]) continue;
                    R zr, sv;
                    logit_b<R>(cfg, q, &K[(size_t)((j * Hkv + hk) * D)], h, p, delta, pj, j, scale, zr, sv);
                    // SPEC 9's S: over the pairs SPEC 3 allows, whether SPEC 6 keeps them or not
                    // (their logits are computed all the same), finite ones (-inf: a key no row uses)
                    if (std::isfinite((double)sv))
                        r.max_logit = std::max(r.max_logit, std::fabs((double)sv));
                    if (!keep[(size_t)(pj - lo)]) continue;
                    s[(size_t)(pj - lo)] = sv;
                    m = any ? std::max(m, sv) : sv;
                    any = true;
                }
                const R sink = cfg.sinks.empty() ? -std::numeric_limits<R>::infinity()
                                                 : (R)cfg.sinks[(size_t)h];
                if (!any && std::isinf((double)sink)) continue; // O stays 0, LSE -inf
                R l = 0;
                std::fill(acc.begin(), acc.end(), (R)0);
                std::fill(mag.begin(), mag.end(), (R)0);
                if (!any) m = sink; // SPEC 11: only the sink, O = 0 and LSE = sink
                for (int64_t pj = lo; pj <= hi; ++pj) {
                    const int64_t j = k0 + pj;
                    if (keys && !(*keys)[(size_t)j]) continue;
                    if (!keep[(size_t)(pj - lo)]) continue;
                    const R pr = std::exp(s[(size_t)(pj - lo)] - m);
                    l += pr;
                    const R pv = flash_round(cfg, round_p, pr);
                    const R *v = &V[(size_t)((j * Hkv + hk) * Dv)];
                    for (int c = 0; c < Dv; ++c) {
                        acc[(size_t)c] += pv * v[c];
                        mag[(size_t)c] += pr * std::fabs(v[c]);
                    }
                }
                if (!std::isinf((double)sink)) { // SPEC 11: one more term, exp(sink), of value 0
                    const R mn = std::max(m, sink), a = std::exp(m - mn);
                    l = l * a + std::exp(sink - mn);
                    for (int c = 0; c < Dv; ++c) acc[(size_t)c] *= a, mag[(size_t)c] *= a;
                    m = mn;
                }
                for (int c = 0; c < Dv; ++c) {
                    R o = acc[(size_t)c] / l;
                    r.O.at(q0 + p, h, c) = round_out ? round_to_dtype((double)o, cfg.dtype) : (double)o;
                    r.O_mag.at(q0 + p, h, c) = (double)(mag[(size_t)c] / l);
                }
                r.lse[(size_t)(h * Tq + q0 + p)] = (double)(m + std::log(l));
            }
        }
    }
    return r;
}

template <class R>
BwdResult bwd_impl(const AttnConfig &cfg, const Dense &Qd, const Dense &Kd, const Dense &Vd,
                   const Dense &Od, const std::vector<double> &lse_d, const Dense &dOd,
                   bool round_out, bool magnitude = false, bool round_p = false)
{
    const int H = cfg.H, Hkv = cfg.hkv(), D = cfg.D, Dv = cfg.dv(), G = H / Hkv;
    const int64_t Tq = cfg.Tq(), Tk = cfg.Tk();
    const std::vector<R> Q = to_vec<R>(Qd), K = to_vec<R>(Kd), V = to_vec<R>(Vd),
                         O = to_vec<R>(Od), dO = to_vec<R>(dOd);
    const R scale = (R)cfg.eff_scale();
    std::vector<R> dQ((size_t)(Tq * H * D), 0), dK((size_t)(Tk * Hkv * D), 0),
        dV((size_t)(Tk * Hkv * Dv), 0);
    check_bias(cfg);
    const int Hb = cfg.key_bias_heads;
    std::vector<R> dB((size_t)(Hb * Tk), 0), dSink((size_t)H, 0);
    std::vector<char> keep;
    std::vector<int64_t> order;
    const std::vector<int32_t> &cuk = cfg.cuk();
    for (int sq = 0; sq < cfg.num_seqs(); ++sq) {
        const int64_t q0 = cfg.cu_q[sq], Lq = cfg.cu_q[sq + 1] - q0;
        const int64_t k0 = cuk[sq], Lk = cuk[sq + 1] - k0, delta = Lk - Lq;
        for (int64_t p = 0; p < Lq; ++p) {
            int64_t lo, hi;
            key_range(cfg, p, delta, Lk, lo, hi);
            for (int h = 0; h < H; ++h) {
                const double lse_i = lse_d[(size_t)(h * Tq + q0 + p)];
                if (lse_i == NEG_INF) continue; // no allowed key: contributes nothing, dQ = 0
                const R lse = (R)lse_i;
                const int hk = h / G;
                const size_t bi = Hb ? (size_t)(cfg.bias_head(h) * Tk) : 0;
                select_keys(cfg, h, k0, lo, hi, keep, order);
                const size_t qi = (size_t)(((q0 + p) * H + h) * D);
                const size_t oi = (size_t)(((q0 + p) * H + h) * Dv);
                R Di = 0;
                for (int c = 0; c < Dv; ++c)
                    Di += magnitude ? std::fabs(dO[oi + c] * O[oi + c]) : dO[oi + c] * O[oi + c];
                if (!cfg.dlse.empty()) { // SPEC 11: D_i - dLSE_i
                    const R g = (R)cfg.dlse[(size_t)(h * Tq + q0 + p)];
                    Di += magnitude ? std::fabs(g) : -g;
                }
                const R sink = cfg.sinks.empty() ? -std::numeric_limits<R>::infinity()
                                                 : (R)cfg.sinks[(size_t)h];
                // P = exp(s - shift) / sum. The plain implementation uses its stored LSE (shift =
                // LSE, sum = 1), as SPEC 9 defines it; the oracle the row's own max and sum, which
                // stay exact where LSE = m + log(l) has lost log(l) (logits all near -1e30: even
                // float64's LSE loses it there).
                R shift = lse, sum = 1;
                if (!round_out) {
                    shift = -std::numeric_limits<R>::infinity();
                    sum = 0;
                    for (int pass = 0; pass < 2; ++pass)
                        for (int64_t pj = lo; pj <= hi; ++pj) {
                            if (!keep[(size_t)(pj - lo)]) continue;
                            const int64_t j = k0 + pj;
                            R zr, sv;
                            logit_b<R>(cfg, &Q[qi], &K[(size_t)((j * Hkv + hk) * D)], h, p, delta,
                                       pj, j, scale, zr, sv);
                            if (pass == 0) shift = std::max(shift, sv);
                            else sum += std::exp(sv - shift);
                        }
                    if (!std::isinf((double)sink)) { // SPEC 11: the sink's term
                        const R mn = std::max(shift, sink);
                        sum = sum * std::exp(shift - mn) + std::exp(sink - mn);
                        shift = mn;
                    }
                }
                // SPEC 11: dsink = -sum_i P_sink,i D_i (D_i less dLSE_i)
                if (!std::isinf((double)sink))
                    dSink[(size_t)h] += std::exp(sink - shift) / sum * (magnitude ? Di : -Di);
                for (int64_t pj = lo; pj <= hi; ++pj) {
                    const int64_t j = k0 + pj;
                    const size_t ki = (size_t)((j * Hkv + hk) * D);
                    const size_t vi = (size_t)((j * Hkv + hk) * Dv);
                    if (!keep[(size_t)(pj - lo)]) continue; // not selected: P = 0
                    R zr, sv;
                    logit_b<R>(cfg, &Q[qi], &K[ki], h, p, delta, pj, j, scale, zr, sv);
                    const R P = std::exp(sv - shift) / sum;
                    R dP = 0;
                    if (magnitude) { // the same sums over |terms| (see oracle.hpp)
                        for (int c = 0; c < Dv; ++c) {
                            dV[vi + c] += P * std::fabs(dO[oi + c]);
                            dP += std::fabs(dO[oi + c] * V[vi + c]);
                        }
                        R dZ = P * (dP + Di);
                        if (Hb) dB[bi + (size_t)j] += dZ; // |dS|, before the softcap derivative
                        if (cfg.softcap > 0) {
                            const R t = std::tanh(zr / (R)cfg.softcap);
                            dZ *= 1 - t * t;
                        }
                        for (int c = 0; c < D; ++c) {
                            dQ[qi + c] += std::fabs(scale) * dZ * std::fabs(K[ki + c]);
                            dK[ki + c] += std::fabs(scale) * dZ * std::fabs(Q[qi + c]);
                        }
                        continue;
                    }
                    const R Pv = flash_round(cfg, round_p, P);
                    for (int c = 0; c < Dv; ++c) {
                        dV[vi + c] += Pv * dO[oi + c];
                        dP += dO[oi + c] * V[vi + c];
                    }
                    const R dS = P * (dP - Di);
                    if (Hb) dB[bi + (size_t)j] += dS; // SPEC 7: dBias sums dS, not dZ
                    R dZ = dS;
                    if (cfg.softcap > 0) {
                        const R t = std::tanh(zr / (R)cfg.softcap);
                        dZ = dS * (1 - t * t);
                    }
                    dZ = flash_round(cfg, round_p, dZ);
                    for (int c = 0; c < D; ++c) {
                        dQ[qi + c] += scale * dZ * K[ki + c];
                        dK[ki + c] += scale * dZ * Q[qi + c];
                    }
                }
            }
        }
    }
    BwdResult r;
    r.dQ = Dense(Tq, H, D);
    r.dK = Dense(Tk, Hkv, D);
    r.dV = Dense(Tk, Hkv, Dv);
    auto out = [&](Dense &d, const std::vector<R> &x) {
        for (size_t i = 0; i < x.size(); ++i)
            d.v[i] = round_out ? round_to_dtype((double)x[i], cfg.dtype) : (double)x[i];
    };
    out(r.dQ, dQ);
    out(r.dK, dK);
    out(r.dV, dV);
    if (Hb) { // float32 storage whatever the dtype: no rounding beyond R's own
        r.dBias = Dense(Hb, 1, Tk);
        for (size_t i = 0; i < dB.size(); ++i) r.dBias.v[i] = (double)dB[i];
    }
    if (!cfg.sinks.empty()) { // float32 too
        r.dSinks = Dense(1, H, 1);
        for (int h = 0; h < H; ++h) r.dSinks.v[(size_t)h] = (double)dSink[(size_t)h];
    }
    return r;
}

} // namespace

std::vector<int64_t> oracle_kept_keys(const AttnConfig &cfg, int64_t i, int h)
{
    check_bias(cfg);
    std::vector<int64_t> out;
    const std::vector<int32_t> &cuk = cfg.cuk();
    for (int sq = 0; sq < cfg.num_seqs(); ++sq) {
        const int64_t q0 = cfg.cu_q[sq], Lq = cfg.cu_q[sq + 1] - q0;
        if (i < q0 || i >= q0 + Lq) continue;
        const int64_t k0 = cuk[sq], Lk = cuk[sq + 1] - k0;
        int64_t lo, hi;
        key_range(cfg, i - q0, Lk - Lq, Lk, lo, hi);
        std::vector<char> keep;
        std::vector<int64_t> order;
        select_keys(cfg, h, k0, lo, hi, keep, order);
        for (int64_t pj = lo; pj <= hi; ++pj)
            if (keep[(size_t)(pj - lo)]) out.push_back(k0 + pj);
    }
    return out;
}

FwdResult oracle_forward(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V,
                         const KeyFilter *keys)
{
    return fwd_impl<double>(cfg, Q, K, V, keys, false);
}

BwdResult oracle_backward(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V,
                          const Dense &O, const std::vector<double> &lse, const Dense &dO)
{
    return bwd_impl<double>(cfg, Q, K, V, O, lse, dO, false);
}

BwdResult oracle_backward_magnitude(const AttnConfig &cfg, const Dense &Q, const Dense &K,
                                    const Dense &V, const Dense &O, const std::vector<double> &lse,
                                    const Dense &dO)
{
    return bwd_impl<double>(cfg, Q, K, V, O, lse, dO, false, true);
}

FwdResult plain_forward(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V)
{
    FwdResult r = fwd_impl<float>(cfg, Q, K, V, nullptr, true, rounds_p(cfg));
    return r; // LSE already a float32 value held in double
}

BwdResult plain_backward(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V,
                         const Dense &O, const std::vector<double> &lse, const Dense &dO)
{
    return bwd_impl<float>(cfg, Q, K, V, O, lse, dO, true, false, rounds_p(cfg));
}

double max_rel_err(const Dense &got, const Dense &ref)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.v.size(); ++i) {
        double d = std::fabs(got.v[i] - ref.v[i]);
        if (!(d <= num)) num = d; // propagates NaN
        den = std::max(den, std::fabs(ref.v[i]));
    }
    if (std::isnan(num)) return NAN;
    if (den == 0) return num == 0 ? 0.0 : INFINITY;
    return num / den;
}

double norm_rel_err(const Dense &got, const Dense &ref)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.v.size(); ++i) {
        double d = got.v[i] - ref.v[i];
        num += d * d;
        den += ref.v[i] * ref.v[i];
    }
    if (std::isnan(num)) return NAN;
    if (den == 0) return num == 0 ? 0.0 : INFINITY;
    return std::sqrt(num / den);
}

double spec_err(const Dense &got, const Dense &ref, const Dense &mag)
{
    double num = 0, den = 0, dm = 0;
    for (size_t i = 0; i < ref.v.size(); ++i) {
        const double d = std::fabs(got.v[i] - ref.v[i]);
        if (!(d <= num)) num = d; // propagates NaN
        den = std::max(den, std::fabs(ref.v[i]));
        dm = std::max(dm, std::fabs(mag.v[i]));
    }
    if (std::isnan(num)) return NAN;
    den = std::max(den, 0.1 * dm);
    if (den == 0) return num == 0 ? 0.0 : INFINITY;
    return num / den;
}

double spec_lse_err(const std::vector<double> &got, const std::vector<double> &ref)
{
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(ref[i])) continue;
        const double e = std::fabs(got[i] - ref[i]) / std::max(1.0, std::fabs(ref[i]));
        if (!(e <= worst)) worst = e; // propagates NaN
    }
    return worst;
}

} // namespace ratest
