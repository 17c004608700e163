// Small-sample statistics (jobs/stats.h).
#include "jobs/stats.h"

#include <cmath>

#include "core/error.h"

namespace nl {

double sample_mean(const std::vector<double>& values) {
    double sum = 0.0;
    for (double v : values) sum += v;
    return values.empty() ? NAN : sum / static_cast<double>(values.size());
}

double sample_std(const std::vector<double>& values) {
    if (values.size() < 2) return NAN;
    const double m = sample_mean(values);
    double sum = 0.0;
    for (double v : values) sum += (v - m) * (v - m);
    return std::sqrt(sum / static_cast<double>(values.size() - 1));
}

double incomplete_beta(double a, double b, double x) {
    NL_CHECK(a > 0.0 && b > 0.0 && x >= 0.0 && x <= 1.0, "incomplete_beta: needs a, b > 0 and x in [0, 1]; found a = ",
             a, ", b = ", b, ", x = ", x);
    if (x == 0.0 || x == 1.0) return x;
    // The continued fraction converges fast for x < (a + 1) / (a + b + 2); beyond, the symmetry
    // I_x(a, b) = 1 - I_{1-x}(b, a) brings x back below it.
    if (x > (a + 1.0) / (a + b + 2.0)) return 1.0 - incomplete_beta(b, a, 1.0 - x);
    const double front =
        std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x)) / a;
    const double tiny = 1e-300;  // keeps Lentz's divisions away from zero
    auto guard = [tiny](double v) { return std::fabs(v) < tiny ? tiny : v; };
    double c = 1.0, d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0));
    double f = d;
    for (int m = 1; m <= 1000; ++m) {
        // The even then the odd term of the fraction (Numerical Recipes' d_{2m} and d_{2m+1}).
        const double even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 / guard(1.0 + even * d);
        c = guard(1.0 + even / c);
        f *= c * d;
        const double odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 / guard(1.0 + odd * d);
        c = guard(1.0 + odd / c);
        const double delta = c * d;
        f *= delta;
        if (std::fabs(delta - 1.0) < 1e-15) break;
    }
    return front * f;
}

double student_t_cdf(double t, double df) {
    NL_CHECK(df > 0.0, "student_t_cdf: needs df > 0, found ", df);
    if (std::isnan(t)) return NAN;
    if (std::isinf(t)) return t > 0 ? 1.0 : 0.0;
    // P(|T| >= |t|) = I_{df / (df + t^2)}(df / 2, 1 / 2).
    const double tail = 0.5 * incomplete_beta(0.5 * df, 0.5, df / (df + t * t));
    return t >= 0.0 ? 1.0 - tail : tail;
}

double student_t_quantile(double p, double df) {
    NL_CHECK(p > 0.0 && p < 1.0 && df > 0.0, "student_t_quantile: needs p in (0, 1) and df > 0; found p = ", p,
             ", df = ", df);
    if (p < 0.5) return -student_t_quantile(1.0 - p, df);
    // The CDF is increasing: widen [0, hi] until it holds p, then halve it. 200 halvings reach the
    // last bit of a double; each costs one incomplete beta, a few microseconds.
    double lo = 0.0, hi = 1.0;
    while (student_t_cdf(hi, df) < p) lo = hi, hi *= 2.0;
    for (int i = 0; i < 200 && hi - lo > 1e-15 * hi; ++i) {
        const double mid = 0.5 * (lo + hi);
        (student_t_cdf(mid, df) < p ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
}

MeanInterval mean_interval(const std::vector<double>& values) {
    MeanInterval out;
    out.mean = sample_mean(values);
    if (values.size() < 2) {
        out.lo = out.hi = NAN;
        return out;
    }
    const double n = static_cast<double>(values.size());
    const double half = student_t_quantile(0.5 + 0.5 * kIntervalConfidence, n - 1.0) * sample_std(values) / std::sqrt(n);
    out.lo = out.mean - half;
    out.hi = out.mean + half;
    return out;
}

}  // namespace nl
