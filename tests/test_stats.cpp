// The statistics behind `normlab sweep`'s summary (jobs/stats.h) against published values: Student-t
// quantiles from the standard tables, the incomplete beta at points with a closed form, the 95%
// interval of a mean by hand; and the sweep's loss-spike count and --shard parsing (jobs/sweep.h).
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "jobs/stats.h"
#include "jobs/sweep.h"

TEST_CASE("stats: Student-t quantiles match the published table", "[sweep][stats]") {
    // t_{0.975, df}: the two-sided 95% critical values (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2).
    CHECK(nl::student_t_quantile(0.975, 1) == Approx(12.7062047).epsilon(1e-8));
    CHECK(nl::student_t_quantile(0.975, 2) == Approx(4.30265273).epsilon(1e-8));
    CHECK(nl::student_t_quantile(0.975, 5) == Approx(2.57058184).epsilon(1e-8));
    CHECK(nl::student_t_quantile(0.975, 15) == Approx(2.13144955).epsilon(1e-8));
    CHECK(nl::student_t_quantile(0.975, 100) == Approx(1.98397152).epsilon(1e-8));
    CHECK(nl::student_t_quantile(0.95, 10) == Approx(1.81246112).epsilon(1e-8));
    // Far out in the tail, and toward the normal distribution's 1.959963985 as df grows (the first
    // correction is (z^3 + z) / (4 df), 2.4e-7 at df 1e7).
    CHECK(nl::student_t_quantile(0.9995, 1) == Approx(636.619249).epsilon(1e-8));
    CHECK(nl::student_t_quantile(0.975, 1e7) == Approx(1.95996398454 + 2.3723e-7).margin(2e-9));
    // Symmetric about 0, and the inverse of the CDF.
    CHECK(nl::student_t_quantile(0.025, 5) == Approx(-2.57058184).epsilon(1e-8));
    CHECK(nl::student_t_quantile(0.5, 3) == Approx(0.0).margin(1e-12));
    CHECK(nl::student_t_cdf(nl::student_t_quantile(0.9, 7), 7) == Approx(0.9).epsilon(1e-12));
    // df = 1 is the Cauchy distribution: CDF 1/2 + atan(t)/pi.
    CHECK(nl::student_t_cdf(3.0, 1) == Approx(0.5 + std::atan(3.0) / std::acos(-1.0)).epsilon(1e-13));
    CHECK(nl::student_t_cdf(-INFINITY, 4) == 0.0);
}

TEST_CASE("stats: the incomplete beta function at closed-form points", "[sweep][stats]") {
    // I_x(a, 1) = x^a; I_x(1, b) = 1 - (1 - x)^b; I_0.5(a, a) = 1/2; I_0.5(2, 3) = 11/16.
    CHECK(nl::incomplete_beta(3.0, 1.0, 0.4) == Approx(std::pow(0.4, 3.0)).epsilon(1e-13));
    CHECK(nl::incomplete_beta(1.0, 4.0, 0.3) == Approx(1.0 - std::pow(0.7, 4.0)).epsilon(1e-13));
    CHECK(nl::incomplete_beta(7.5, 7.5, 0.5) == Approx(0.5).epsilon(1e-13));
    CHECK(nl::incomplete_beta(2.0, 3.0, 0.5) == Approx(11.0 / 16.0).epsilon(1e-13));
    CHECK(nl::incomplete_beta(2.0, 3.0, 0.0) == 0.0);
    CHECK(nl::incomplete_beta(2.0, 3.0, 1.0) == 1.0);
}

TEST_CASE("stats: a mean's 95% interval is mean -+ t * s / sqrt(n), none for one value", "[sweep][stats]") {
    // (1, 2, 3): mean 2, s = 1, t_{0.975, 2} = 4.302653.
    const nl::MeanInterval m = nl::mean_interval({1.0, 2.0, 3.0});
    CHECK(m.mean == 2.0);
    CHECK(m.lo == Approx(2.0 - 4.30265273 / std::sqrt(3.0)).epsilon(1e-8));
    CHECK(m.hi == Approx(2.0 + 4.30265273 / std::sqrt(3.0)).epsilon(1e-8));
    const nl::MeanInterval same = nl::mean_interval({0.5, 0.5});
    CHECK(same.lo == 0.5);
    CHECK(same.hi == 0.5);
    const nl::MeanInterval one = nl::mean_interval({4.0});
    CHECK(one.mean == 4.0);
    CHECK(std::isnan(one.lo));
    CHECK(std::isnan(one.hi));
    CHECK(std::isnan(nl::sample_mean({})));
    CHECK(nl::sample_std({1.0, 3.0}) == Approx(std::sqrt(2.0)));
}

TEST_CASE("sweep: loss_spikes counts steps above 2x the median of the 20 steps before", "[sweep][stats]") {
    REQUIRE(nl::kLossSpikeFactor == 2.0);
    REQUIRE(nl::kLossSpikeWindow == 20);
    std::vector<double> flat(40, 1.0);
    CHECK(nl::count_loss_spikes(flat) == 0);
    std::vector<double> losses = flat;
    losses[25] = 2.5;   // above 2 x median 1: a spike
    losses[30] = 2.0;   // exactly 2 x the median: not above it
    losses[5] = 9.0;    // in the first window: not judged
    CHECK(nl::count_loss_spikes(losses) == 1);
    // The median ignores the one spike in the window: step 26 back at 1.0 is no spike, 2.1 is.
    losses[26] = 2.1;
    CHECK(nl::count_loss_spikes(losses) == 2);
    // A falling curve: the median of the window is what it is compared with, not the first loss.
    std::vector<double> falling;
    for (int i = 0; i < 60; ++i) falling.push_back(10.0 / (1.0 + i));
    CHECK(nl::count_loss_spikes(falling) == 0);
    falling[50] = 0.6;  // the 20 before it have median 0.247
    CHECK(nl::count_loss_spikes(falling) == 1);
    // A non-finite loss is a spike; a window holding one is still judged.
    losses = flat;
    losses[21] = NAN;
    losses[22] = INFINITY;
    CHECK(nl::count_loss_spikes(losses) == 2);
    CHECK(nl::count_loss_spikes(std::vector<double>(20, 1.0)) == 0);
    CHECK(nl::count_loss_spikes({}) == 0);
}

TEST_CASE("sweep: --shard K/N parses and refuses what is not 0 <= K < N", "[sweep]") {
    const nl::SweepShard s = nl::parse_shard("3/4");
    CHECK(s.index == 3);
    CHECK(s.count == 4);
    CHECK(nl::parse_shard("0/1").count == 1);
    for (const char* bad : {"4/4", "5/4", "0/0", "1", "a/b", "1/2/3", "-1/2", "1/-2", "/2", "1/", " 1/2", "1/2x", ""}) {
        INFO(bad);
        REQUIRE_THROWS_WITH(nl::parse_shard(bad),
                            Catch::Contains("--shard: expected K/N") && Catch::Contains(std::string("found \"") + bad + "\""));
    }
}
