// The repository stands on its own: no tracked file names a folder of the machine it was written
// on, no markdown link leaves the repository, and no text counts the project's own work periods or
// tracker issues by number, or stamps figures with commit hashes (git log holds the history,
// CHANGELOG.md the user-visible changes). Every relative link of a markdown file, and every repository
// path its text names in backticks, exists. The files are those `git ls-files` lists in
// NORMLAB_SOURCE_DIR; the scanners are checked on small texts first, so a scanner that finds
// nothing cannot pass for a clean repository. Also: every test case's name is one CTest can run, and the
// README stays under 16 KB without counting tests, docs/benchmarks.md under 500 lines.
#include <catch2/catch.hpp>

#include "cli_test_util.h"

#include <sys/wait.h>

#include <regex>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
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

// ---- markdown: links and backticked paths that name nothing ----

// Whether a path, relative to the repository root and without a trailing '/', exists (a file or a
// folder). The tests pass a made-up tree; the repository test asks the file system.
using PathExists = std::function<bool(const std::string&)>;

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

bool ends_with(const std::string& text, const std::string& suffix) {
    return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The text with the lines of every fenced code block (``` or ~~~, the fences included) and every
// line of only spaces and tabs emptied; the newlines stay, so an offset's line number is the
// original one and a blank line is "\n\n".
std::string prose_lines(const std::string& text) {
    std::string out;
    std::string fence;  // the open block's marker, "```" or "~~~"; empty outside a block
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(start, end - start);
        const size_t indent = line.find_first_not_of(" \t");
        const std::string body = indent == std::string::npos ? "" : line.substr(indent);
        const bool inside = !fence.empty();
        const bool opens = !inside && indent < 4 && (starts_with(body, "```") || starts_with(body, "~~~"));
        if (opens) fence = body.substr(0, 3);
        else if (inside && starts_with(body, fence)) fence.clear();
        if (!opens && !inside && indent != std::string::npos) out += line;
        if (end < text.size()) out += '\n';
        start = end + 1;
    }
    return out;
}

struct CodeSpan {
    size_t at = 0;        // the offset of the opening backticks
    size_t length = 0;    // of the whole span, backticks included
    std::string content;  // between the backticks
};

// Markdown's code spans (CommonMark): a run of n backticks opens one and the next run of exactly n
// backticks in the same paragraph closes it; a run with no such partner is plain text.
std::vector<CodeSpan> code_spans(const std::string& text) {
    std::vector<CodeSpan> spans;
    auto run_end = [&text](size_t at) {
        while (at < text.size() && text[at] == '`') ++at;
        return at;
    };
    size_t at = text.find('`');
    while (at != std::string::npos) {
        const size_t open_end = run_end(at);
        const size_t paragraph_end = text.find("\n\n", open_end);
        size_t close = std::string::npos;
        for (size_t k = text.find('`', open_end); k != std::string::npos && k < paragraph_end;
             k = text.find('`', run_end(k))) {
            if (run_end(k) - k == open_end - at) {
                close = k;
                break;
            }
        }
        if (close == std::string::npos) {
            at = text.find('`', open_end);
            continue;
        }
        const size_t span_end = run_end(close);
        spans.push_back({at, span_end - at, text.substr(open_end, close - open_end)});
        at = text.find('`', span_end);
    }
    return spans;
}

// Whether a code span's content names a path in the repository, to be checked: one token of path
// characters only (letters, digits, '_', '-', '.', '/') whose first component is a top-level entry
// of the repository (a tracked file or folder), without "..". So commands and other spans with
// spaces, placeholders (`jobs/<job>.h`, `core/cuda/*.cu`, `core/dist.{h,cpp}`, `$DIR/x`,
// `configs/...`), names like `optim.AdamW` and paths a run creates (`runs/...`, `build/normlab`: no
// tracked entry starts them) are not checked.
bool names_repository_path(const std::string& span, const std::set<std::string>& top_level) {
    if (span.empty() || span.find("..") != std::string::npos) return false;
    for (char ch : span)
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-' && ch != '.' && ch != '/')
            return false;
    return top_level.count(span.substr(0, span.find('/'))) > 0;
}

struct MarkdownTargets {
    std::vector<Finding> missing;
    size_t links = 0;  // relative link targets checked
    size_t paths = 0;  // backticked repository paths checked
};

// In one markdown file (`file`, relative to the repository root): every relative link target
// (inline links and images, `](target)`, and reference definitions, `[name]: target`; the #fragment
// stripped; URLs with "://", mailto: and links to the page's own anchors skipped) that does not
// exist relative to the file's folder, and, with check_paths, every code span naming a repository
// path (names_repository_path) that does not exist relative to the root. Fenced code blocks are
// skipped, and links are looked for outside code spans. A target that leaves the repository is
// left to find_markdown_problems.
MarkdownTargets find_missing_targets(const std::string& file, const std::string& text,
                                     const std::set<std::string>& top_level, const PathExists& exists,
                                     bool check_paths) {
    MarkdownTargets result;
    const std::string lines = prose_lines(text);
    const fs::path folder = fs::path(file).parent_path();
    auto exists_path = [&exists](std::string path) {
        while (path.size() > 1 && path.back() == '/') path.pop_back();
        return exists(path);
    };
    // The prose: code spans blanked out (newlines kept), so `a[i](j)` in code is no link.
    std::string prose = lines;
    for (const CodeSpan& span : code_spans(lines)) {
        for (size_t i = span.at; i < span.at + span.length; ++i)
            if (prose[i] != '\n') prose[i] = ' ';
        if (!check_paths || !names_repository_path(span.content, top_level)) continue;
        ++result.paths;
        if (!exists_path(span.content))
            result.missing.push_back({file, line_of(lines, span.at),
                                      "a repository path in backticks that does not exist: " + span.content});
    }
    auto check_link = [&](std::string target, size_t at) {
        if (starts_with(target, "<")) target = target.substr(1, target.find('>') - 1);
        target = target.substr(0, target.find('#'));
        if (target.empty() || target.find("://") != std::string::npos || starts_with(target, "mailto:")) return;
        const fs::path resolved = (folder / target).lexically_normal();
        if (target.front() == '/' || resolved.empty() || *resolved.begin() == "..") return;
        ++result.links;
        if (!exists_path(resolved.generic_string()))
            result.missing.push_back({file, line_of(prose, at), "a link to a file that does not exist: " + target +
                                                                    " (" + resolved.generic_string() + ")"});
    };
    for (size_t at = prose.find("]("); at != std::string::npos; at = prose.find("](", at + 2)) {
        size_t end = at + 2;
        while (end < prose.size() && prose[end] != ')' && !std::isspace(static_cast<unsigned char>(prose[end]))) ++end;
        check_link(prose.substr(at + 2, end - at - 2), at);
    }
    size_t offset = 0;
    std::istringstream prose_stream(prose);
    for (std::string line; std::getline(prose_stream, line); offset += line.size() + 1) {
        const size_t open = line.find_first_not_of(' ');
        const size_t close = line.find("]:");
        if (open == std::string::npos || line[open] != '[' || close == std::string::npos || close < open) continue;
        std::istringstream rest(line.substr(close + 2));
        std::string target;
        if (rest >> target) check_link(target, offset + close);
    }
    return result;
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

TEST_CASE("the markdown scanner finds missing link targets and missing backticked repository paths",
          "[repository]") {
    // A made-up repository: its top-level entries, and the files and folders that exist.
    const std::set<std::string> top_level = {"README.md", "docs", "configs", "layers", ".ci"};
    const std::set<std::string> present = {"README.md", "docs",   "docs/a.md", "docs/b.md", "docs/img.png",
                                           "configs",   "configs/x.json",      "layers",    "layers/n.h",
                                           ".ci",       ".ci/run"};
    const PathExists exists = [&present](const std::string& path) { return present.count(path) > 0; };
    auto missing = [&](const std::string& file, const std::string& text, bool check_paths = true) {
        return find_missing_targets(file, text, top_level, exists, check_paths).missing;
    };
    SECTION("links, relative to the file's folder") {
        const MarkdownTargets good = find_missing_targets(
            "docs/a.md",
            "[b](b.md) [top](../README.md#quick-start) [p](img.png \"title\") [c](<b.md>) [d](../docs/)\n"
            "[ref]: b.md#x\n[self](#heading) [w](https://example.org/no.md) [m](mailto:a@example.org)",
            top_level, exists, true);
        CHECK(good.missing.empty());
        CHECK(good.links == 6);  // the URLs and the page's own anchor are not counted
        const std::vector<Finding> bad = missing("docs/a.md", "fine\n\nsee [c](c.md#part) and ![p](pic.png)\n");
        REQUIRE(bad.size() == 2);
        CHECK(bad[0].file == "docs/a.md");
        CHECK(bad[0].line == 3);
        CHECK_THAT(bad[0].what, Catch::Contains("c.md (docs/c.md)"));
        CHECK_THAT(bad[1].what, Catch::Contains("pic.png"));
        CHECK(missing("docs/a.md", "[readme](README.md)").size() == 1);  // docs/README.md: not the root's
        CHECK(missing("README.md", "[readme](README.md) [a](docs/a.md)").empty());
        CHECK(missing("docs/a.md", "[d]: gone.md").size() == 1);
        // Links that leave the repository are find_markdown_problems' findings, not these.
        CHECK(missing("docs/a.md", "[x](../../outside.md)").empty());
        // In code there are no links: a code span, a fenced block.
        CHECK(missing("docs/a.md", "`f[0](x)` and\n```cpp\ng[1](y);\n[z](nowhere.md)\n```\n").empty());
    }
    SECTION("repository paths in backticks, relative to the root") {
        const MarkdownTargets good = find_missing_targets(
            "docs/a.md", "`configs/x.json`, `layers/n.h`, `docs/`, `.ci/run`, ``configs`` and `README.md`", top_level,
            exists, true);
        CHECK(good.missing.empty());
        CHECK(good.paths == 6);
        const std::vector<Finding> bad = missing("docs/a.md", "line one\n\nread `configs/y.json` and ``layers/m.h``");
        REQUIRE(bad.size() == 2);
        CHECK(bad[0].line == 3);
        CHECK_THAT(bad[0].what, Catch::Contains("configs/y.json"));
        CHECK_THAT(bad[1].what, Catch::Contains("layers/m.h"));
        // Not repository paths: placeholders, commands, names, paths a run creates, other top-level names.
        const MarkdownTargets skipped = find_missing_targets(
            "docs/a.md",
            "`configs/<name>.json` `layers/*.h` `layers/n.{h,cpp}` `$DIR/configs/y.json` `configs/...` "
            "`configs/y.json --set a=1` `layers.0.weight` `runs/x/config.json` `build/normlab` `examples/y.cpp` "
            "`../configs/y.json`",
            top_level, exists, true);
        CHECK(skipped.missing.empty());
        CHECK(skipped.paths == 0);
        // A fenced block is code, not a path; an unpaired backtick does not shift the spans after it.
        CHECK(missing("docs/a.md", "```\n`configs/y.json`\n```\n").empty());
        CHECK(missing("docs/a.md", "a lone ` here\n\nthen `configs/y.json`").size() == 1);
        // Without check_paths (CHANGELOG.md), links only.
        CHECK(missing("CHANGELOG.md", "`configs/y.json` [x](nope.md)", false).size() == 1);
    }
}

TEST_CASE("every relative link in the markdown files and every repository path they name in backticks exists",
          "[repository]") {
    const std::vector<std::string> files = tracked_files();
    std::set<std::string> top_level;
    for (const std::string& name : files) top_level.insert(name.substr(0, name.find('/')));
    const fs::path root = NORMLAB_SOURCE_DIR;
    const PathExists exists = [&root](const std::string& path) { return fs::exists(root / path); };
    std::vector<Finding> findings;
    std::set<std::string> scanned;
    size_t links = 0, paths = 0;
    for (const std::string& name : files) {
        const fs::path path = root / name;
        if (!ends_with(name, ".md") || !fs::is_regular_file(path)) continue;
        // CHANGELOG.md names files as they were when each change was made: its links are checked, its
        // backticked paths are not.
        const MarkdownTargets found =
            find_missing_targets(name, nl_test::read_text(path.string()), top_level, exists, name != "CHANGELOG.md");
        findings.insert(findings.end(), found.missing.begin(), found.missing.end());
        links += found.links;
        paths += found.paths;
        scanned.insert(name);
    }
    INFO(scanned.size() << " markdown files scanned, " << links << " links and " << paths
                        << " backticked paths checked; findings:\n"
                        << describe(findings));
    CHECK(scanned.count("README.md") == 1);
    CHECK(scanned.count("docs/architecture.md") == 1);
    CHECK(links > 20);   // the docs link to each other and to the sources
    CHECK(paths > 100);  // and name the sources in backticks throughout
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

TEST_CASE("docs/benchmarks.md stays a reference: under 500 lines", "[repository]") {
    const std::string page = nl_test::read_text(std::string(NORMLAB_SOURCE_DIR) + "/docs/benchmarks.md");
    REQUIRE(!page.empty());
    CHECK(std::count(page.begin(), page.end(), '\n') < 500);
}

TEST_CASE("the README stays a front door: under 16 KB, and no count of tests that no test keeps true", "[repository]") {
    const std::string readme = nl_test::read_text(std::string(NORMLAB_SOURCE_DIR) + "/README.md");
    REQUIRE(!readme.empty());
    CHECK(readme.size() < 16000);
    // "443 tests", "24 CUDA tests", "out of 443": the suite's size changes with every test added.
    const std::regex count(R"((\b[0-9]+ (CUDA |Python |C\+\+ )?tests\b)|(out of [0-9]+))");
    std::smatch found;
    const bool counts = std::regex_search(readme, found, count);
    INFO("the README states " << (counts ? found.str() : std::string()));
    CHECK_FALSE(counts);
}
