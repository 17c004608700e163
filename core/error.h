// Errors: user mistakes throw nl::Error with a message naming what was expected and what was found;
// broken internal invariants throw nl::InternalError naming file and line. Never exit() or abort().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace nl {

// A user mistake: bad shape, bad dtype, bad config, bad file. The message is meant for the user.
class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A bug inside normlab: an invariant that should always hold did not.
class InternalError : public std::logic_error {
public:
    explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
}
}  // namespace detail

}  // namespace nl

// Throw nl::Error with the parts streamed together when `cond` is false (user-facing checks).
#define NL_REQUIRE(cond, ...)                                   \
    do {                                                        \
        if (!(cond)) throw ::nl::Error(::nl::detail::concat(__VA_ARGS__)); \
    } while (0)

// Internal invariant: names file and line, because only a developer can act on it.
#define NL_CHECK(cond, ...)                                                              \
    do {                                                                                 \
        if (!(cond))                                                                     \
            throw ::nl::InternalError(::nl::detail::concat(__FILE__, ":", __LINE__,      \
                                                           ": check failed: " #cond " ", \
                                                           ##__VA_ARGS__));              \
    } while (0)
