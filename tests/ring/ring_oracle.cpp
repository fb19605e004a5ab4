#include "ring/ring_oracle.hpp"

#include <algorithm>
#include <cmath>

#include "support/half.hpp"

namespace ringtest {

ratest::AttnConfig oracle_config(const Problem &pb)
{
    ratest::AttnConfig c;
    c.H = pb.H;
    c.Hkv = pb.Hkv;
    c.D = pb.D;
    c.Dv = pb.Dv;
    c.dtype = pb.dtype;
    c.cu_q = pb.cu;
    c.causal = pb.causal != 0;
    c.wl = pb.wl;
    c.wr = pb.wr;
    c.softcap = pb.softcap;
    c.alibi = pb.alibi;
    c.key_bias_heads = pb.key_bias_heads;
    c.keep_k = pb.keep_k;
    c.bias.assign(pb.bias.begin(), pb.bias.end());
    return c;
}

void oracle_inputs(const Problem &pb, ratest::Dense &Q, ratest::Dense &K, ratest::Dense &V,
                   ratest::Dense &dO)
{
    const int64_t T = pb.T();
    auto conv = [&](const std::vector<float> &f, const std::vector<uint16_t> &h, int heads, int dim) {
        ratest::Dense d(T, heads, dim);
        for (size_t i = 0; i < d.v.size(); ++i)
            d.v[i] = pb.dtype == RINGATTN_FLOAT32   ? (double)f[i]
                     : pb.dtype == RINGATTN_FLOAT16 ? (double)ratest::half_bits_to_float(h[i])
                                                    : (double)ratest::bf16_bits_to_float(h[i]);
        return d;
    };
    Q = conv(pb.q32, pb.q16, pb.H, pb.D);
    K = conv(pb.k32, pb.k16, pb.Hkv, pb.D);
    V = conv(pb.v32, pb.v16, pb.Hkv, pb.Dv);
    dO = conv(pb.do32, pb.do16, pb.H, pb.Dv);
}

GradFloors magnitude_floors(const Problem &pb)
{
    const ratest::AttnConfig c = oracle_config(pb);
    ratest::Dense Q, K, V, dO;
    oracle_inputs(pb, Q, K, V, dO);
    const ratest::FwdResult f = ratest::oracle_forward(c, Q, K, V);
    const ratest::BwdResult m = ratest::oracle_backward_magnitude(c, Q, K, V, f.O, f.lse, dO);
    auto mx = [](const ratest::Dense &d) {
        double x = 0;
        for (double v : d.v) x = std::max(x, std::fabs(v));
        return ratest::GRAD_MAG_FLOOR * x;
    };
    GradFloors fl;
    fl.dq = mx(m.dQ);
    fl.dk = mx(m.dK);
    fl.dv = mx(m.dV);
    fl.dbias = mx(m.dBias);
    return fl;
}

double o_vs_oracle(const Problem &pb, const Result &r)
{
    const ratest::AttnConfig c = oracle_config(pb);
    ratest::Dense Q, K, V, dO;
    oracle_inputs(pb, Q, K, V, dO);
    const ratest::FwdResult f = ratest::oracle_forward(c, Q, K, V);
    ratest::Dense got(f.O.T, f.O.heads, f.O.dim);
    for (size_t i = 0; i < got.v.size(); ++i) got.v[i] = r.o[i];
    return ratest::max_rel_err(got, f.O);
}

} // namespace ringtest
