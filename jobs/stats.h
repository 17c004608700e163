// Small-sample statistics for the jobs' summaries: the mean, the sample standard deviation, Student's
// t distribution (its CDF and quantiles, through the regularized incomplete beta function) and the
// Student-t 95% interval of a mean. `normlab sweep` (jobs/sweep.h) reports its per-lr losses and its
// paired differences to a baseline variant with these.
#pragma once

#include <vector>

namespace nl {

// The mean of `values`; NaN for none.
double sample_mean(const std::vector<double>& values);

// The sample standard deviation (divisor n - 1); NaN for fewer than 2 values.
double sample_std(const std::vector<double>& values);

// The regularized incomplete beta function I_x(a, b) for a, b > 0 and x in [0, 1], by its continued
// fraction (Lentz's method; Press et al., Numerical Recipes, 3rd ed., section 6.4), to about 1e-14.
double incomplete_beta(double a, double b, double x);

// P(T <= t) for Student's t with `df` > 0 degrees of freedom.
double student_t_cdf(double t, double df);

// The p-quantile of Student's t with `df` > 0 degrees of freedom, p in (0, 1): the t with
// student_t_cdf(t, df) == p, to about 1e-12 relative (bisection). t_{0.975, 1} = 12.706.
double student_t_quantile(double p, double df);

// The confidence level of every interval the summaries report.
inline constexpr double kIntervalConfidence = 0.95;

// A mean and its two-sided Student-t interval at kIntervalConfidence:
// mean -+ t_{(1 + 0.95) / 2, n - 1} * s / sqrt(n), s the sample standard deviation. lo and hi are NaN
// for fewer than 2 values (one value says nothing of the spread).
struct MeanInterval {
    double mean = 0.0;
    double lo = 0.0;
    double hi = 0.0;
};
MeanInterval mean_interval(const std::vector<double>& values);

}  // namespace nl
