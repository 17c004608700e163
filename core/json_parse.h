// JSON text from files, flags and checkpoints, parsed with bounds. nlohmann's parser, its copies,
// comparisons and dump() recurse once per nesting level, so a few thousand levels of [[[...]]]
// overflow the stack: deeper nesting than kMaxJsonDepth is refused before parsing. Every parse
// failure (syntax, a number too large for a double such as 1e400) is an nl::Error naming where the
// text came from.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace nl {

// Real configs nest 3 levels, safetensors headers 3; 64 leaves room for any sane document while
// keeping the recursion shallow.
inline constexpr int kMaxJsonDepth = 64;

// Throws nl::Error "<where>: JSON nested deeper than 64 levels (at byte N)" when an array or
// object opens below depth `max_depth`. Brackets inside strings do not count. Linear time; says
// nothing about whether the rest of the text is valid JSON.
void check_json_depth(std::string_view text, const std::string& where, int max_depth = kMaxJsonDepth);

// check_json_depth, then nlohmann::json::parse. Errors: "<where>: malformed JSON at byte N: ..."
// or "<where>: invalid JSON: ..." (e.g. a number out of range).
nlohmann::json parse_json(std::string_view text, const std::string& where);

// dump() shortened to at most `max_chars` characters ("..." marks a cut), for error messages about
// values that may be megabytes long.
std::string brief_json(const nlohmann::json& value, size_t max_chars = 120);

}  // namespace nl
