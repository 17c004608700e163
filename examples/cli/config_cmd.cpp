// `normlab config`: what the config schema (jobs/config_schema.h) says, for people and editors:
//   normlab config --schema JOB       the JSON Schema (draft 2020-12) of JOB's config files
//   normlab config --markdown JOB     docs/configs.md's table of JOB's keys
//   normlab config --defaults JOB     a config holding every fixed default
//   normlab config --write-schemas DIR   DIR/<job>.schema.json for every job (docs/schema/ ships them)
//   normlab config --update-docs FILE    the generated tables of FILE (docs/configs.md) rewritten
// JOB is train, stability or bench_norms. Files are written atomically.
#include "examples/cli/commands.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <fmt/core.h>

#include "core/error.h"
#include "jobs/config_schema.h"
#include "jobs/run_dir.h"

namespace nl::cli {

namespace {

struct Options {
    std::string schema, markdown, defaults, write_schemas, update_docs;
};

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    NL_REQUIRE(in.good() && std::filesystem::is_regular_file(path), path,
               ": cannot open (expected a markdown file holding generated config tables): ", std::strerror(errno));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

std::string job_list() {
    std::string out;
    for (const std::string& job : config_jobs()) out += (out.empty() ? "" : ", ") + job;
    return out;
}

}  // namespace

void register_config(CLI::App& app) {
    auto opt = std::make_shared<Options>();
    CLI::App* cmd = app.add_subcommand(
        "config", "The config schema of each job (" + job_list() + "): JSON Schema for editors, docs tables, defaults");
    cmd->add_option("--schema", opt->schema, "print the JSON Schema (draft 2020-12) of JOB's config files")
        ->option_text("JOB");
    cmd->add_option("--markdown", opt->markdown, "print docs/configs.md's table of JOB's keys")->option_text("JOB");
    cmd->add_option("--defaults", opt->defaults, "print a config of JOB holding every fixed default")
        ->option_text("JOB");
    cmd->add_option("--write-schemas", opt->write_schemas, "write DIR/<job>.schema.json for every job")
        ->option_text("DIR");
    cmd->add_option("--update-docs", opt->update_docs,
                    "rewrite the generated tables of FILE (docs/configs.md) from the schema")
        ->option_text("FILE");
    cmd->require_option(1);
    cmd->callback([opt] {
        if (!opt->schema.empty()) {
            fmt::print("{}\n", json_schema(config_schema(opt->schema)).dump(2));
        } else if (!opt->markdown.empty()) {
            fmt::print("{}", config_markdown_table(config_schema(opt->markdown)));
        } else if (!opt->defaults.empty()) {
            fmt::print("{}\n", config_defaults(config_schema(opt->defaults)).dump(2));
        } else if (!opt->write_schemas.empty()) {
            NL_REQUIRE(std::filesystem::is_directory(opt->write_schemas), opt->write_schemas,
                       ": expected an existing directory");
            for (const std::string& job : config_jobs()) {
                const std::string path = opt->write_schemas + "/" + job + ".schema.json";
                write_file_atomic(path, json_schema(config_schema(job)).dump(2) + "\n");
                fmt::print("{}\n", path);
            }
        } else {
            const std::string text = read_text(opt->update_docs);
            const std::string updated = update_generated_config_tables(text, opt->update_docs);
            if (updated != text) write_file_atomic(opt->update_docs, updated);
            fmt::print("{}: {}\n", opt->update_docs, updated == text ? "up to date" : "tables rewritten");
        }
    });
}

}  // namespace nl::cli
