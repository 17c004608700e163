// Gemm engines chosen by their measured rates, kept per machine (core/cpu/cpu_engine_choice.h).
#include "core/cpu/cpu_engine_choice.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "core/cpu_runtime.h"
#include "core/error.h"

namespace nl {

namespace fs = std::filesystem;
using json = nlohmann::json;

size_t fastest_engine(const std::vector<EngineRate>& rates) {
    size_t best = rates.size();
    for (size_t i = 0; i < rates.size(); ++i) {
        if (!rates[i].why_not.empty()) continue;
        if (best == rates.size() || rates[i].gflops > kEngineMargin * rates[best].gflops) best = i;
    }
    std::string names;
    for (const EngineRate& r : rates) names += (names.empty() ? "" : ", ") + r.key + " (" + r.why_not + ")";
    NL_REQUIRE(best < rates.size(), "no gemm engine runs on this CPU: ", names);
    return best;
}

bool engine_beats(const std::vector<EngineRate>& rates, const std::string& faster, const std::string& than) {
    double fast = -1.0, slow = 0.0;
    for (const EngineRate& r : rates) {
        if (!r.why_not.empty()) continue;
        if (r.key == faster) fast = r.gflops;
        if (r.key == than) slow = r.gflops;
    }
    return fast > 0.0 && fast >= kEngineMargin * slow;
}

std::string EngineChoice::rates_text() const {
    std::string out;
    for (const EngineRate& r : rates) {
        if (!r.why_not.empty()) continue;
        out += (out.empty() ? "" : ", ") + fmt::format("{} {:.1f}", r.key, r.gflops);
    }
    return out + " GFLOP/s";
}

EngineProbeOperands::EngineProbeOperands()
    : a(static_cast<size_t>(kEngineProbeM * kEngineProbeK)), b(static_cast<size_t>(kEngineProbeN * kEngineProbeK)) {
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) * 0.25f - 0.75f;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) * 0.125f - 0.25f;
}

std::string engine_cache_path() {
    if (const char* path = std::getenv("NORMLAB_ENGINE_CACHE"); path != nullptr && *path != '\0')
        return std::string(path) == "off" ? "" : std::string(path);
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0')
        return std::string(xdg) + "/normlab/gemm_engines.json";
    if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
        return std::string(home) + "/.cache/normlab/gemm_engines.json";
    return "";
}

std::string engine_cache_machine() {
    std::string model = "unknown CPU";
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
        if (line.rfind("model name", 0) != 0) continue;
        const size_t colon = line.find(':');
        if (colon != std::string::npos) model = line.substr(line.find_first_not_of(" \t", colon + 1));
        break;
    }
    return fmt::format("{} | {} | normlab {} | probe {}", model, cpu_vector_support(), NORMLAB_VERSION, kEngineProbeVersion);
}

namespace {

// The candidates' keys, in order, that this CPU runs: what a cached choice must have been made among.
json runnable_keys(const std::vector<EngineRate>& candidates) {
    json keys = json::array();
    for (const EngineRate& r : candidates)
        if (r.why_not.empty()) keys.push_back(r.key);
    return keys;
}

// The cache file's JSON, or an empty object when it is absent or unreadable (it is then rewritten).
json read_cache(const std::string& path) {
    std::ifstream in(path);
    if (!in) return json::object();
    try {
        json cache = json::parse(in);
        return cache.is_object() ? cache : json::object();
    } catch (const json::exception&) {
        return json::object();
    }
}

// The cached choice of `kind` for this machine and these engines, if there is one.
bool cached_choice(const json& cache, const std::string& kind, const std::string& machine, EngineChoice& choice) {
    if (!cache.contains(kind) || !cache[kind].is_object()) return false;
    const json& entry = cache[kind];
    if (entry.value("machine", "") != machine || entry.value("engines", json()) != runnable_keys(choice.rates) ||
        !entry.contains("rates") || !entry["rates"].is_object())
        return false;
    for (EngineRate& r : choice.rates) {
        if (!r.why_not.empty()) continue;
        if (!entry["rates"].contains(r.key) || !entry["rates"][r.key].is_number()) return false;
        r.gflops = entry["rates"][r.key].get<double>();
    }
    // The fastest of the cached rates, so a cache edited by hand (or by a test) is read the same way.
    choice.key = choice.rates[fastest_engine(choice.rates)].key;
    return true;
}

// Rounds of one probe per engine; each engine's rate is its best round's.
constexpr int kProbeRounds = 7;

// On one thread: a core busy elsewhere (another tenant, a build) slows a thread team that shares work
// out statically far more than one that does not, and would decide the choice; one thread on a free
// core measures the kernels. omp_set_num_threads reaches OpenBLAS's OpenMP build too (it follows
// omp_get_max_threads at each call).
void measure(EngineChoice& choice, const EngineProbe& probe, double flops) {
    using clock = std::chrono::steady_clock;
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    std::vector<double> best(choice.rates.size(), 1e300);
    for (int round = -1; round < kProbeRounds; ++round) {  // round -1 warms up: packs, threads, caches
        for (size_t i = 0; i < choice.rates.size(); ++i) {
            if (!choice.rates[i].why_not.empty()) continue;
            const auto start = clock::now();
            probe(choice.rates[i].key);
            const double seconds = std::chrono::duration<double>(clock::now() - start).count();
            if (round >= 0) best[i] = std::min(best[i], seconds);
        }
    }
    omp_set_num_threads(threads);
    for (size_t i = 0; i < choice.rates.size(); ++i)
        if (choice.rates[i].why_not.empty()) choice.rates[i].gflops = flops / std::max(best[i], 1e-9) * 1e-9;
    choice.key = choice.rates[fastest_engine(choice.rates)].key;
}

// Writes `text` to `path` through a temporary file and a rename, so a reader never sees half of it;
// false (and no temporary file left) when it cannot. (core/ has no text writer of its own to share:
// jobs/run_dir.h's write_file_atomic is a layer above, and throws where a cache must not.)
bool write_atomic(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    bool written = false;
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << text;
        written = static_cast<bool>(out.flush());
    }
    if (written && std::rename(tmp.c_str(), path.c_str()) == 0) return true;
    std::remove(tmp.c_str());
    return false;
}

}  // namespace

EngineChoice choose_engine_by_rate(const std::string& kind, std::vector<EngineRate> candidates,
                                   const EngineProbe& probe, double probe_flops) {
    EngineChoice choice;
    choice.rates = std::move(candidates);
    const std::string path = engine_cache_path();
    if (path.empty()) {
        measure(choice, probe, probe_flops);
        choice.source = "measured now; no cache (NORMLAB_ENGINE_CACHE=off)";
        return choice;
    }
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    // One process measures while the others wait for its result: the lock is a file beside the cache.
    const int lock = ::open((path + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
        if (lock >= 0) ::close(lock);
        measure(choice, probe, probe_flops);
        choice.source = "measured now; the cache " + path + " cannot be used";
        return choice;
    }
    const std::string machine = engine_cache_machine();
    json cache = read_cache(path);
    if (cached_choice(cache, kind, machine, choice)) {
        choice.source = "measured earlier, kept in " + path;
    } else {
        measure(choice, probe, probe_flops);
        json rates = json::object();
        for (const EngineRate& r : choice.rates)
            if (r.why_not.empty()) rates[r.key] = r.gflops;
        cache[kind] = {{"machine", machine}, {"engines", runnable_keys(choice.rates)}, {"rates", rates},
                       {"chosen", choice.key}};
        choice.source = write_atomic(path, cache.dump(2) + "\n") ? "measured now, kept in " + path
                                                                  : "measured now; the cache " + path + " cannot be written";
    }
    ::flock(lock, LOCK_UN);
    ::close(lock);
    return choice;
}

}  // namespace nl
