// Bounded JSON parsing (see json_parse.h).
#include "core/json_parse.h"

#include "core/error.h"

namespace nl {

void check_json_depth(std::string_view text, const std::string& where, int max_depth) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            NL_REQUIRE(++depth <= max_depth, where, ": JSON nested deeper than ", max_depth, " levels (at byte ", i,
                       "); normlab refuses deeper nesting");
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
}

nlohmann::json parse_json(std::string_view text, const std::string& where) {
    check_json_depth(text, where);
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
        throw Error(detail::concat(where, ": malformed JSON at byte ", e.byte, ": ", e.what()));
    } catch (const nlohmann::json::exception& e) {
        throw Error(detail::concat(where, ": invalid JSON: ", e.what()));
    }
}

std::string brief_json(const nlohmann::json& value, size_t max_chars) {
    // A string value can hold invalid UTF-8 (a file's bytes); replace it rather than throw.
    std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (text.size() > max_chars) text = text.substr(0, max_chars) + "...";
    return text;
}

}  // namespace nl
