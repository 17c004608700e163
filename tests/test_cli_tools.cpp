// `normlab gradcheck` (every norm in both forms, every layer and loss, in f64) and `normlab graph`
// (a norm's autograd graph: saved bytes, DOT, PNG when Graphviz is installed), run as the built binary.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <regex>
#include <string>

#include "layers/norm_registry.h"
#include "layers/transformer.h"
#include "tests/cli_test_util.h"

using nl_test::CliRun;
using nl_test::file_exists;
using nl_test::make_temp_dir;
using nl_test::read_text;
using nl_test::run_normlab_in;

namespace {

// "saved for backward: 144 B (composed form: 320 B)" -> {144, 320}
std::pair<long, long> saved_bytes(const std::string& output) {
    std::smatch match;
    REQUIRE(std::regex_search(output, match, std::regex(R"(saved for backward: (\d+) B \(\w+ form: (\d+) B\))")));
    return {std::stol(match[1]), std::stol(match[2])};
}

bool have(const char* program) { return std::system((std::string("command -v ") + program + " >/dev/null 2>&1").c_str()) == 0; }

}  // namespace

TEST_CASE("normlab gradcheck passes every norm (both forms, composed to 2nd order), layer and loss",
          "[cli-tools]") {
    CliRun run = run_normlab_in(make_temp_dir("gradcheck"), "gradcheck");
    INFO(run.output);
    REQUIRE(run.status == 0);
    for (const std::string& norm : nl::norm_types()) {  // every registered norm
        INFO(norm);
        CHECK(std::regex_search(run.output, std::regex("\\n" + norm + " +fused +1st .* ok")));
        CHECK(std::regex_search(run.output, std::regex("\\n" + norm + " +composed +1st .* ok")));
        CHECK(std::regex_search(run.output, std::regex("\\n" + norm + " +composed +2nd .* ok")));
    }
    for (const char* layer : {"\nlinear ", "\nembedding ", "\nswiglu ", "\nattention ", "\nmse_loss ", "\ncross_entropy "})
        CHECK_THAT(run.output, Catch::Contains(layer));
    for (const std::string& placement : nl::norm_placement_names())  // a block per placement (mix is the model's)
        if (placement != "mix") CHECK_THAT(run.output, Catch::Contains("\nblock (" + placement + ") "));
    CHECK_THAT(run.output, Catch::Contains("checks passed"));
    CHECK_THAT(run.output, !Catch::Contains("FAILED"));
}

TEST_CASE("normlab gradcheck --filter runs only the matching checks, no match is an error", "[cli-tools]") {
    const std::string dir = make_temp_dir("gradcheck");
    CliRun run = run_normlab_in(dir, "gradcheck --filter layernorm");
    INFO(run.output);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.output, Catch::Contains("3 of 3 checks passed"));  // fused, composed, 2nd order
    CHECK_THAT(run.output, !Catch::Contains("rmsnorm"));
    CliRun none = run_normlab_in(dir, "gradcheck --filter batchnorm");
    CHECK(none.status == 2);
    CHECK(none.output == "normlab: error: gradcheck: no check matches --filter 'batchnorm'\n");
}

TEST_CASE("normlab graph writes a norm's DOT graph and reports fused < composed saved bytes", "[cli-tools]") {
    const std::string dir = make_temp_dir("graph");
    for (const char* norm : {"rmsnorm", "layernorm"}) {
        INFO(norm);
        CliRun fused = run_normlab_in(dir, std::string("graph --layer ") + norm + " --fused --dot fused.dot");
        INFO(fused.output);
        REQUIRE(fused.status == 0);
        const std::string dot = read_text(dir + "/fused.dot");
        CHECK_THAT(dot, Catch::StartsWith("digraph"));
        CHECK(have("dot") == file_exists(dir + "/fused.png"));
        auto [fused_bytes, composed_bytes] = saved_bytes(fused.output);
        // The fused node keeps x (4 x 8 f32 = 128 B) and rstd (4 f32 = 16 B), plus mean for LayerNorm.
        CHECK(fused_bytes == (std::string(norm) == "rmsnorm" ? 144 : 160));
        CHECK(composed_bytes > fused_bytes);

        CliRun composed = run_normlab_in(dir, std::string("graph --layer ") + norm + " --composed --dot composed.dot");
        INFO(composed.output);
        REQUIRE(composed.status == 0);
        auto [composed_again, fused_again] = saved_bytes(composed.output);
        CHECK(composed_again == composed_bytes);
        CHECK(fused_again == fused_bytes);
        // The composed graph has more nodes than the one fused node.
        const std::string composed_dot = read_text(dir + "/composed.dot");
        CHECK(std::count(composed_dot.begin(), composed_dot.end(), '\n') > std::count(dot.begin(), dot.end(), '\n'));
    }
}

TEST_CASE("normlab graph rejects an unknown layer and contradictory flags with exit code 2", "[cli-tools]") {
    const std::string dir = make_temp_dir("graph");
    CliRun unknown = run_normlab_in(dir, "graph --layer batchnorm");
    CHECK(unknown.status == 2);
    CHECK_THAT(unknown.output, Catch::StartsWith("normlab: error: ") && Catch::Contains("batchnorm") &&
                                   Catch::Contains("rmsnorm"));
    CliRun both = run_normlab_in(dir, "graph --layer rmsnorm --fused --composed");
    CHECK(both.status == 2);
    CHECK(both.output == "normlab: error: graph: give --fused or --composed, not both\n");
    CliRun no_layer = run_normlab_in(dir, "graph");
    CHECK(no_layer.status != 0);
    CHECK_THAT(no_layer.output, Catch::Contains("--layer"));
}
