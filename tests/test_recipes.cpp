// docs/architecture.md's recipes ("Extending": a kernel, a norm, a placement, a config key) held true
// for every row they apply to, so that a row added without one of its steps fails a test and the
// recipes cannot go stale. The steps other tests already enforce are named beside each case.
#include <catch2/catch.hpp>

#include <string>

#include "cli_test_util.h"
#include "layers/norm_registry.h"
#include "layers/transformer.h"

using namespace nl;

namespace {

const std::string kSource = NORMLAB_SOURCE_DIR;

// The text of `path` (relative to the source root) from the line `heading` to the next heading of
// the same or a higher level; empty when the heading is absent.
std::string section(const std::string& path, const std::string& heading) {
    const std::string text = nl_test::read_text(kSource + "/" + path);
    const size_t start = text.find("\n" + heading + "\n");
    if (start == std::string::npos) return "";
    const size_t level = heading.find(' ');  // the number of '#'
    size_t end = start + 1;
    for (;;) {
        end = text.find("\n#", end + 1);
        if (end == std::string::npos) break;
        const size_t hashes = text.find_first_not_of('#', end + 1) - (end + 1);
        if (hashes <= level) break;
    }
    return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

TEST_CASE("recipes: docs/architecture.md has the four recipes, each with a worked example", "[recipes]") {
    const std::string extending = section("docs/architecture.md", "## Extending");
    REQUIRE(!extending.empty());
    for (const char* recipe : {"### A new kernel", "### A new norm", "### A new norm placement", "### A new config key"}) {
        INFO(recipe);
        const std::string body = section("docs/architecture.md", recipe);
        REQUIRE(!body.empty());
        CHECK(body.find("Worked example") != std::string::npos);
        CHECK(body.find("Enforced by") != std::string::npos);
    }
}

// A norm: its registry entry, its row in tests/test_norms.cpp's kNormRows (test_norms fails without
// it), its PyTorch formula in tests/python/test_torch.py's FORMULAS (that test fails without it),
// and its row in docs/norms.md's table (here).
TEST_CASE("recipes: every norm of the registry has its row in docs/norms.md's table", "[recipes]") {
    const std::string table = section("docs/norms.md", "## The norms");
    REQUIRE(!table.empty());
    for (const NormType& type : norm_registry()) {
        INFO("norm " << type.name);
        CHECK(table.find("| `" + type.name + "` | `" + type.class_name + "` |") != std::string::npos);
    }
}

// A placement: its row in norm_placements(), its PyTorch formula in examples/python/torch_model.py
// (the replay's and the fixtures' model), a case in tests/reference/make_fixtures.py's transformer
// variants (which tests/test_reference_transformer_variants.cpp checks against) and its row in
// docs/norms.md's table.
TEST_CASE("recipes: every norm placement has its docs row, its PyTorch formula and a fixture case", "[recipes]") {
    const std::string table = section("docs/norms.md", "## Norm placements");
    const std::string torch_model = nl_test::read_text(kSource + "/examples/python/torch_model.py");
    const std::string generator = nl_test::read_text(kSource + "/tests/reference/make_fixtures.py");
    REQUIRE(!table.empty());
    REQUIRE(!torch_model.empty());
    REQUIRE(!generator.empty());
    REQUIRE(norm_placements().size() >= 7);
    for (const NormPlacement& placement : norm_placements()) {
        INFO("placement " << placement.name);
        CHECK(table.find("| `" + placement.name + "`") != std::string::npos);
        CHECK(torch_model.find('"' + placement.name + '"') != std::string::npos);
        CHECK(generator.find("\"norm_placement\": \"" + placement.name + '"') != std::string::npos);
    }
}

TEST_CASE("recipes: the section finder stops at the next heading of its level and finds nothing absent",
          "[recipes]") {
    const std::string table = section("docs/norms.md", "## The norms");
    CHECK(table.find("## Norm placements") == std::string::npos);
    CHECK(table.find("### DyT") != std::string::npos);  // a subsection stays inside
    CHECK(section("docs/norms.md", "## No such heading").empty());
}
