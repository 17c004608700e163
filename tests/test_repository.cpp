// The repository stands on its own: no tracked file names a folder of the machine it was written
// on, no markdown link leaves the repository, and no text counts the project's own work periods or
// tracker issues by number, or stamps figures with commit hashes (git log holds the history,
// CHANGELOG.md the user-visible changes). The files are those `git ls-files` lists in
// NORMLAB_SOURCE_DIR; the scanners are checked on small texts first, so a scanner that finds
// nothing cannot pass for a clean repository. Also: every test case's name is one CTest can run.
#include <catch2/catch.hpp>

#include "cli_test_util.h"

#include <sys/wait.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// Top-level folders that exist only on a development machine (its checkouts, home folders and
// scratch space), never in a user's clone. Written without their slashes so this file does not
// contain what it looks for.
const std::vector<std::string> kMachineRoots = {"work", "root", "home", "tmp", "mnt", "Users", "scratch"};

// Paths under those roots that name the same thing on every machine: scratch folders a program or
// script creates for itself ("/tmp/normlab-<tag>-XXXXXX" by mkdtemp, the GPU check's work folder).
const std::vector<std::string> kAllowedPathPrefixes = {"/tmp/normlab-"};

struct Finding {
    std::string file;
    size_t line = 0;
    std::string what;
};

size_t line_of(const std::string& text, size_t offset) {
    size_t line = 1;
    for (size_t i = 0; i < offset && i < text.size(); ++i) line += text[i] == '\n';
    return line;
}

// The text from `offset` to the end of its path-like run, for the message.
std::string token_at(const std::string& text, size_t offset) {
    size_t end = offset;
    while (end < text.size() && end - offset < 80 && !std::isspace(static_cast<unsigned char>(text[end])) &&
           text[end] != '"' && text[end] != '\'' && text[end] != '`' && text[end] != ')' && text[end] != ',')
        ++end;
    return text.substr(offset, end - offset);
}

// "/<root>/" starting a path: the character before it does not continue a word, a variable or a
// relative path ("$work/root/..." and "build/tmp/..." are relative; a file:// URL's path is not).
void find_machine_paths(const std::string& file, const std::string& text, std::vector<Finding>& out) {
    for (const std::string& root : kMachineRoots) {
        const std::string needle = "/" + root + "/";
        for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
            if (at > 0) {
                const char before = text[at - 1];
                if (std::isalnum(static_cast<unsigned char>(before)) || before == '_' || before == '.' ||
                    before == '-' || before == '~' || before == '$' || before == '}' || before == ')')
                    continue;
            }
            bool allowed = false;
            for (const std::string& prefix : kAllowedPathPrefixes) allowed |= text.compare(at, prefix.size(), prefix) == 0;
            if (allowed) continue;
            out.push_back({file, line_of(text, at), "an absolute path of the development machine: " + token_at(text, at)});
        }
    }
}

std::string lowercase(std::string text) {
    for (char& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return text;
}

// The word "issue" or "session" (any case, optionally plural) followed by a number, with or
// without spaces or a '#' between: a tracker issue or a work period counted by number.
void find_history_numbers(const std::string& file, const std::string& text, std::vector<Finding>& out) {
    const std::string lower = lowercase(text);
    for (const std::string word : {"issue", "session"}) {
        for (size_t at = lower.find(word); at != std::string::npos; at = lower.find(word, at + 1)) {
            if (at > 0 && std::isalpha(static_cast<unsigned char>(lower[at - 1]))) continue;
            size_t i = at + word.size();
            if (i < lower.size() && lower[i] == 's') ++i;
            size_t gap = i;
            while (i < lower.size() && (lower[i] == ' ' || lower[i] == '\t')) ++i;
            if (i < lower.size() && lower[i] == '#') ++i;
            if (i == gap) continue;  // "issue3_fixture" is a name, not a number
            if (i < lower.size() && std::isdigit(static_cast<unsigned char>(lower[i])))
                out.push_back({file, line_of(text, at), "a numbered issue or work period: " +
                                                            text.substr(at, i + 1 - at)});
        }
    }
}

bool is_hex_stamp(const std::string& word) {
    if (word.size() < 7 || word.size() > 40) return false;
    bool digit = false, letter = false;
    for (char ch : word) {
        if (std::isdigit(static_cast<unsigned char>(ch))) digit = true;
        else if (ch >= 'a' && ch <= 'f') letter = true;
        else return false;
    }
    return digit && letter;
}

// Markdown only: a link whose target leaves the repository (an absolute path, or ../ past the root),
// and a `1a2b3c4`-style commit hash, the mark of a figure stamped with the commit it was measured at.
void find_markdown_problems(const std::string& file, const std::string& text, std::vector<Finding>& out) {
    const fs::path folder = fs::path(file).parent_path();
    auto check_target = [&](std::string target, size_t at) {
        if (!target.empty() && target.front() == '<') target = target.substr(1, target.find('>') - 1);
        target = target.substr(0, target.find('#'));
        if (target.empty() || target.find("://") != std::string::npos || target.rfind("mailto:", 0) == 0) return;
        const fs::path resolved = (folder / target).lexically_normal();
        if (target.front() == '/' || resolved.empty() || *resolved.begin() == "..")
            out.push_back({file, line_of(text, at), "a link that leaves the repository: " + target});
    };
    // Inline links and images: ](target) or ](target "title").
    for (size_t at = text.find("]("); at != std::string::npos; at = text.find("](", at + 2)) {
        size_t end = at + 2;
        while (end < text.size() && text[end] != ')' && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
        check_target(text.substr(at + 2, end - at - 2), at);
    }
    // Reference definitions: a line "[name]: target".
    std::istringstream lines(text);
    std::string line;
    size_t offset = 0;
    while (std::getline(lines, line)) {
        const size_t open = line.find_first_not_of(' ');
        const size_t close = line.find("]:");
        if (open != std::string::npos && line[open] == '[' && close != std::string::npos && close > open) {
            std::istringstream rest(line.substr(close + 2));
            std::string target;
            if (rest >> target) check_target(target, offset + close);
        }
        offset += line.size() + 1;
    }
    for (size_t at = text.find('`'); at != std::string::npos; at = text.find('`', at + 1)) {
        const size_t end = text.find('`', at + 1);
        if (end == std::string::npos) break;
        if (is_hex_stamp(text.substr(at + 1, end - at - 1)))
            out.push_back({file, line_of(text, at), "a commit hash: " + text.substr(at, end - at + 1)});
        at = end;
    }
}

std::vector<Finding> scan(const std::string& file, const std::string& text) {
    std::vector<Finding> found;
    find_machine_paths(file, text, found);
    find_history_numbers(file, text, found);
    if (file.size() > 3 && file.compare(file.size() - 3, 3, ".md") == 0) find_markdown_problems(file, text, found);
    return found;
}

std::string describe(const std::vector<Finding>& findings) {
    std::string out;
    for (const Finding& f : findings) out += f.file + ":" + std::to_string(f.line) + ": " + f.what + "\n";
    return out;
}

// The tracked files, relative to the source folder, from `git ls-files -z` run there.
std::vector<std::string> tracked_files() {
    const std::string command = "git ls-files -z";
    const nl_test::CliRun run = nl_test::run_shell_in(NORMLAB_SOURCE_DIR, command);
    const std::string& output = run.output;
    const int status = run.status;
    INFO("this test reads the list of tracked files from git, so it needs git and a git checkout of the "
         "sources (a fresh clone, as CI makes)");
    INFO("`" << command << "` exited with " << status << ": " << output);
    REQUIRE(status == 0);
    std::vector<std::string> files;
    std::istringstream names(output);
    std::string name;
    while (std::getline(names, name, '\0'))
        if (!name.empty()) files.push_back(name);
    REQUIRE(files.size() > 10);  // a listing that found almost nothing is not a listing of this project
    return files;
}

}  // namespace

TEST_CASE("the repository scanners find machine paths, numbered issues, stray links and commit stamps",
          "[repository]") {
    const std::string root = "/" + kMachineRoots[0] + "/";  // the first machine root, as a path
    SECTION("absolute paths of the development machine") {
        CHECK(scan("a.json", "\"path\": \"" + root + "shared/data/x.txt\"").size() == 1);
        CHECK(scan("a.md", "see file://" + root + "notes").size() == 1);
        CHECK(scan("a.sh", "cd /" + kMachineRoots[2] + "/me/src").size() == 1);
        CHECK(scan("a.cpp", "std::ifstream(\"/" + kMachineRoots[3] + "/out.txt\")").size() == 1);
        // System paths, relative paths, variables and the allowed scratch folders are not.
        CHECK(scan("a.cpp", "/usr/include /proc/self/exe /sys/devices/system /dev/null /usr/local/cuda").empty());
        CHECK(scan("a.sh", "$work/root/MANIFEST.txt ${dir}/tmp/x build/tmp/y ~/home/z").empty());
        CHECK(scan("a.h", "\"/tmp/normlab-\" + tag + \"-XXXXXX\"").empty());
        CHECK(scan("a.cpp", "{\"/model/norm\", \"/data/path\"}").empty());  // JSON pointers
    }
    SECTION("numbered issues and work periods") {
        CHECK(scan("a.cpp", std::string("// tolerances of Issue ") + "4").size() == 1);
        CHECK(scan("a.md", std::string("Until session ") + "3 the norms ...").size() == 1);
        CHECK(scan("a.py", std::string("see issue #") + "12").size() == 1);
        CHECK(scan("a.md", std::string("sessions ") + "2-3").size() == 1);
        CHECK(scan("a.md", "the session state, an issue with 3 causes, tissue 4, issue3_fixture").empty());
    }
    SECTION("markdown links and commit stamps") {
        CHECK(scan("README.md", "[design](../shared/DESIGN.md)").size() == 1);
        CHECK(scan("docs/a.md", "[x](../../outside.md)").size() == 1);
        CHECK(scan("docs/a.md", "[x](" + root + "notes.md)").size() == 2);  // a machine path, and absolute
        CHECK(scan("docs/a.md", "[d]: ../../elsewhere.md").size() == 1);
        CHECK(scan("docs/a.md", "[readme](../README.md) [b](benchmarks.md#figures) [w](https://example.org/a/../b) "
                                "[t](#top) ![p](img/x.png)").empty());
        CHECK(scan("README.md", std::string("Fresh clones at `") + "243deb7" + "`").size() == 1);
        CHECK(scan("README.md", "`deadbeef` `0x1f` `1234567` `a1b2c`").empty());
        CHECK(scan("notes.txt", std::string("[x](../") + "y)").empty());  // links are checked in markdown only
    }
}

TEST_CASE("no tracked file names a development machine's path, a numbered issue, or links out of the repository",
          "[repository]") {
    std::vector<Finding> findings;
    size_t scanned = 0;
    for (const std::string& name : tracked_files()) {
        const fs::path path = fs::path(NORMLAB_SOURCE_DIR) / name;
        if (!fs::is_regular_file(path)) continue;  // deleted in this checkout, or a submodule
        std::ifstream in(path, std::ios::binary);
        std::stringstream text;
        text << in.rdbuf();
        const std::vector<Finding> found = scan(name, text.str());
        findings.insert(findings.end(), found.begin(), found.end());
        ++scanned;
    }
    INFO(scanned << " tracked files scanned; findings:\n" << describe(findings));
    CHECK(scanned > 10);
    CHECK(findings.empty());
}

// CMake reads a test name as a list, so catch_discover_tests cuts a name at its first ';', and Catch,
// given the cut name, matches no test case, runs nothing and exits 0: CTest would report a test that
// never ran as passed.
TEST_CASE("no test case name contains a semicolon, which would make CTest run nothing and pass", "[repository]") {
    const std::vector<Catch::TestCase>& tests = Catch::getRegistryHub().getTestCaseRegistry().getAllTests();
    REQUIRE(tests.size() > 100);  // the whole suite is registered in this binary
    std::string offending;
    for (const Catch::TestCase& test : tests)
        if (test.getTestCaseInfo().name.find(';') != std::string::npos) offending += test.getTestCaseInfo().name + "\n";
    INFO("test cases whose names contain ';':\n" << offending);
    CHECK(offending.empty());
}
