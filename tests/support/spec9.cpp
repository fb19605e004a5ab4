#include "support/spec9.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ratest {

double f32_limit_out(double max_logit) { return 1e-5 * std::max(1.0, max_logit / 16); }
double f32_limit_grad(double max_logit) { return 1e-4 * std::max(1.0, max_logit / 16); }

namespace {

struct Judge {
    const AttnConfig &cfg;
    const Spec9Options &opt;
    bool ok = true;
    void within(const char *what, double err, double limit)
    {
        static const bool report = std::getenv("RATEST_REPORT") != nullptr;
        if (report)
            std::printf("ratest %-3s err %-11.4g limit %-11.4g ratio %.3f | %s %s\n", what, err,
                        limit, err / limit, opt.label.c_str(), cfg.describe().c_str());
        INFO(what << " error " << err << " limit " << limit << " " << opt.label);
        if (!(err <= limit)) ok = false;
        CHECK(err <= limit);
    }
    // float32: the rule's limit; half: 2x the plain implementation's error, at least that.
    double limit(double f32_limit, double plain_err) const
    {
        if (cfg.dtype == RINGATTN_FLOAT32) return f32_limit;
        return std::max(2 * plain_err, f32_limit);
    }
};

} // namespace

Spec9::Spec9(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V,
             const Dense &dO, bool backward)
    : cfg_(cfg), backward_(backward)
{
    ref_ = oracle_forward(cfg, Q, K, V);
    const bool half = cfg.dtype != RINGATTN_FLOAT32;
    if (half) plain_ = plain_forward(cfg, Q, K, V);
    if (!backward) return;
    grad_ = oracle_backward(cfg, Q, K, V, ref_.O, ref_.lse, dO);
    mag_ = oracle_backward_magnitude(cfg, Q, K, V, ref_.O, ref_.lse, dO);
    if (half) plain_grad_ = plain_backward(cfg, Q, K, V, plain_.O, plain_.lse, dO);
}

bool Spec9::check(const Got &got, const Spec9Options &opt) const
{
    Judge j{cfg_, opt};
    const double S = opt.exact_logits ? 0.0 : ref_.max_logit;
    const bool half = cfg_.dtype != RINGATTN_FLOAT32;
    const double lim_o = f32_limit_out(S), lim_g = f32_limit_grad(S);
    j.within("O", spec_err(got.O, ref_.O, ref_.O_mag),
             j.limit(lim_o, half ? spec_err(plain_.O, ref_.O, ref_.O_mag) : 0));
    j.within("LSE", spec_lse_err(got.lse, ref_.lse),
             j.limit(lim_o, half ? spec_lse_err(plain_.lse, ref_.lse) : 0));
    if (!opt.backward || !backward_) return j.ok;
    auto grad = [&](const char *what, const Dense &x, const Dense &r, const Dense &mag,
                    const Dense &p) {
        j.within(what, spec_err(x, r, mag), j.limit(lim_g, half ? spec_err(p, r, mag) : 0));
    };
    grad("dQ", got.dQ, grad_.dQ, mag_.dQ, plain_grad_.dQ);
    grad("dK", got.dK, grad_.dK, mag_.dK, plain_grad_.dK);
    grad("dV", got.dV, grad_.dV, mag_.dV, plain_grad_.dV);
    if (!got.dBias.v.empty()) grad("dB", got.dBias, grad_.dBias, mag_.dBias, plain_grad_.dBias);
    if (!got.dSinks.v.empty()) grad("dSk", got.dSinks, grad_.dSinks, mag_.dSinks, plain_grad_.dSinks);
    return j.ok;
}

bool spec9_check(const AttnConfig &cfg, const Dense &Q, const Dense &K, const Dense &V,
                 const Dense &dO, const Got &got, const Spec9Options &opt)
{
    return Spec9(cfg, Q, K, V, dO, opt.backward).check(got, opt);
}

} // namespace ratest
