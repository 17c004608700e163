// Synthetic sequence tasks, character-level text and token files for `normlab train` (see data.h for
// the layouts).
#include "jobs/data.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/json_parse.h"
#include "jobs/config.h"

namespace nl {

namespace {

// The held-out stream's Philox key differs from the training stream's (seed), so the two never
// share random numbers, whatever the seed.
constexpr uint64_t kHeldOutKey = 0x9E3779B97F4A7C15ull;

constexpr int64_t kDigits = 10;
constexpr int64_t kPlus = 10;    // "add" tokens
constexpr int64_t kEquals = 11;

bool is_add(const DataOptions& options) { return options.task == "add"; }

}  // namespace

// ---- synthetic tasks ----

SyntheticTask::SyntheticTask(const DataOptions& options, const std::string& where) : options_(options) {
    const std::vector<std::string> tasks = {"copy", "reverse", "sort", "add"};
    NL_REQUIRE(std::find(tasks.begin(), tasks.end(), options.task) != tasks.end(), where,
               "/task: expected one of copy, reverse, sort, add, got \"", options.task, "\"");
    NL_REQUIRE(options.length >= 1, where, "/length: expected an integer >= 1, got ", options.length);
    NL_REQUIRE(is_add(options) || options.symbols >= 2, where, "/symbols: expected an integer >= 2, got ",
               options.symbols);
    NL_REQUIRE(options.eval_sequences >= 1, where, "/eval_sequences: expected an integer >= 1, got ",
               options.eval_sequences);
    // Distinct held-out prompts, and training prompts drawn outside them, need a space of problems
    // well above the held-out count (10x keeps the rejection rate of training draws under 10%).
    double alphabet = is_add(options) ? 100.0 : static_cast<double>(options.symbols);
    double space = std::pow(alphabet, static_cast<double>(options.length));
    NL_REQUIRE(space >= 10.0 * static_cast<double>(options.eval_sequences), where,
               "/length: only ", space, " distinct ", options.task, " problems of this length, need at least 10 x ",
               "eval_sequences = ", 10 * options.eval_sequences, " (raise length or symbols, or lower eval_sequences)");

    Generator held_out_gen(options.seed ^ kHeldOutKey);
    while (static_cast<int64_t>(held_out_.size()) < options.eval_sequences) {
        Problem problem = make_problem(held_out_gen);
        if (held_out_prompts_.insert(problem.prompt).second) held_out_.push_back(std::move(problem));
    }
}

int64_t SyntheticTask::vocab_size_of(const DataOptions& options) {
    return is_add(options) ? kDigits + 2 : options.symbols + 1;
}

int64_t SyntheticTask::vocab_size() const { return vocab_size_of(options_); }

int64_t SyntheticTask::prompt_length() const {
    // x1..xL SEP, or a1..aL + b1..bL =
    return is_add(options_) ? 2 * options_.length + 2 : options_.length + 1;
}

int64_t SyntheticTask::answer_length() const { return is_add(options_) ? options_.length + 1 : options_.length; }

Problem SyntheticTask::make_problem(Generator& gen) const {
    Problem problem;
    const int64_t L = options_.length;
    if (is_add(options_)) {
        std::vector<int64_t> a(L), b(L);  // most significant digit first
        for (int64_t& digit : a) digit = static_cast<int64_t>(gen.next_below(kDigits));
        for (int64_t& digit : b) digit = static_cast<int64_t>(gen.next_below(kDigits));
        problem.prompt = a;
        problem.prompt.push_back(kPlus);
        problem.prompt.insert(problem.prompt.end(), b.begin(), b.end());
        problem.prompt.push_back(kEquals);
        // Schoolbook addition from the least significant digit: the answer's order.
        int64_t carry = 0;
        for (int64_t i = L - 1; i >= 0; --i) {
            int64_t s = a[i] + b[i] + carry;
            problem.answer.push_back(s % kDigits);
            carry = s / kDigits;
        }
        problem.answer.push_back(carry);
        return problem;
    }
    std::vector<int64_t> x(L);
    for (int64_t& symbol : x) symbol = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(options_.symbols)));
    problem.prompt = x;
    problem.prompt.push_back(options_.symbols);  // SEP
    problem.answer = x;
    if (options_.task == "reverse") std::reverse(problem.answer.begin(), problem.answer.end());
    if (options_.task == "sort") std::sort(problem.answer.begin(), problem.answer.end());
    return problem;
}

Batch SyntheticTask::make_batch(const std::vector<Problem>& problems) const {
    const int64_t B = static_cast<int64_t>(problems.size());
    const int64_t T = seq_len();
    const int64_t P = prompt_length();
    std::vector<int64_t> inputs(B * T), targets(B * T, kIgnoreIndex);  // (B, T) each
    for (int64_t b = 0; b < B; ++b) {
        std::vector<int64_t> sequence = problems[b].prompt;
        sequence.insert(sequence.end(), problems[b].answer.begin(), problems[b].answer.end());
        for (int64_t t = 0; t < T; ++t) {
            inputs[b * T + t] = sequence[t];
            // Position t predicts sequence[t + 1]; only answer tokens (index >= P) carry a loss.
            if (t + 1 >= P) targets[b * T + t] = sequence[t + 1];
        }
    }
    return {from_vector(inputs, {B, T}), from_vector(targets, {B, T})};
}

Batch SyntheticTask::train_batch(int64_t batch_size, Generator& gen) {
    std::vector<Problem> problems;
    problems.reserve(batch_size);
    while (static_cast<int64_t>(problems.size()) < batch_size) {
        Problem problem = make_problem(gen);
        if (!held_out_prompts_.count(problem.prompt)) problems.push_back(std::move(problem));
    }
    return make_batch(problems);
}

std::vector<Batch> SyntheticTask::eval_batches(int64_t batch_size) const {
    std::vector<Batch> batches;
    for (size_t start = 0; start < held_out_.size(); start += batch_size) {
        size_t end = std::min(held_out_.size(), start + static_cast<size_t>(batch_size));
        batches.push_back(make_batch({held_out_.begin() + start, held_out_.begin() + end}));
    }
    return batches;
}

std::string SyntheticTask::format_answer(const std::vector<int64_t>& answer) const {
    std::string out;
    if (is_add(options_)) {
        // Stored least significant digit first; shown the usual way round.
        for (auto it = answer.rbegin(); it != answer.rend(); ++it) out += decode({*it});
        return out;
    }
    for (size_t i = 0; i < answer.size(); ++i) {
        if (i > 0) out += ' ';
        out += decode({answer[i]});
    }
    return out;
}

std::string SyntheticTask::format_problem(const Problem& problem) const {
    if (is_add(options_)) return decode(problem.prompt);
    std::vector<int64_t> symbols(problem.prompt.begin(), problem.prompt.end() - 1);
    return options_.task + " " + format_answer(symbols);
}

std::string SyntheticTask::decode(const std::vector<int64_t>& tokens) const {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
        int64_t token = tokens[i];
        if (is_add(options_)) {
            out += token == kPlus ? "+" : token == kEquals ? "=" : std::to_string(token);
        } else {
            if (i > 0) out += ' ';
            out += token == options_.symbols ? std::string("|") : std::to_string(token);
        }
    }
    return out;
}

// ---- UTF-8 ----

std::vector<uint32_t> decode_utf8(const std::string& bytes, const std::string& path) {
    std::vector<uint32_t> out;
    out.reserve(bytes.size());
    size_t i = 0;
    while (i < bytes.size()) {
        const auto byte = [&](size_t k) { return static_cast<uint8_t>(bytes[k]); };
        uint8_t lead = byte(i);
        size_t extra = lead < 0x80 ? 0 : (lead >> 5) == 0x6 ? 1 : (lead >> 4) == 0xE ? 2 : (lead >> 3) == 0x1E ? 3 : 9;
        NL_REQUIRE(extra != 9, path, ": invalid UTF-8 at byte ", i, " (byte ", static_cast<int>(lead),
                   " cannot start a character)");
        NL_REQUIRE(i + extra < bytes.size(), path, ": invalid UTF-8 at byte ", i,
                   " (a character cut off at the end of the file)");
        uint32_t cp = extra == 0 ? lead : extra == 1 ? (lead & 0x1F) : extra == 2 ? (lead & 0x0F) : (lead & 0x07);
        for (size_t k = 1; k <= extra; ++k) {
            NL_REQUIRE((byte(i + k) & 0xC0) == 0x80, path, ": invalid UTF-8 at byte ", i,
                       " (expected a continuation byte)");
            cp = (cp << 6) | (byte(i + k) & 0x3F);
        }
        // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8 (RFC 3629).
        static const uint32_t kMinimum[4] = {0, 0x80, 0x800, 0x10000};
        NL_REQUIRE(cp >= kMinimum[extra] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF), path,
                   ": invalid UTF-8 at byte ", i, " (overlong, surrogate or out-of-range character)");
        out.push_back(cp);
        i += extra + 1;
    }
    return out;
}

std::string encode_utf8(const std::vector<uint32_t>& codepoints) {
    std::string out;
    for (uint32_t cp : codepoints) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }
    return out;
}

// ---- windows of a token sequence (text and token files) ----

namespace {

// The windows of `split` at `starts`: row b's inputs are split[s .. s + T - 1] and its targets
// split[s + 1 .. s + T], s = starts[b].
Batch window_batch(const std::vector<uint32_t>& split, const std::vector<int64_t>& starts, int64_t T) {
    const int64_t B = static_cast<int64_t>(starts.size());
    std::vector<int64_t> inputs(B * T), targets(B * T);  // (B, T) each
    for (int64_t b = 0; b < B; ++b) {
        const int64_t s = starts[b];
        for (int64_t t = 0; t < T; ++t) {
            inputs[b * T + t] = split[s + t];
            targets[b * T + t] = split[s + t + 1];
        }
    }
    return {from_vector(inputs, {B, T}), from_vector(targets, {B, T})};
}

}  // namespace

Batch WindowedCorpus::train_batch(int64_t batch_size, Generator& gen) {
    const int64_t T = seq_len_;
    const uint64_t count = static_cast<uint64_t>(train_tokens() - T);  // windows [s, s + T] fit
    std::vector<int64_t> starts(batch_size);
    for (int64_t& s : starts) s = static_cast<int64_t>(gen.next_below(count));
    return window_batch(train_, starts, T);
}

std::vector<Batch> WindowedCorpus::eval_batches(int64_t batch_size) const {
    // No randomness: every eval scores the same windows, so val losses are comparable across steps and runs.
    const int64_t T = seq_len_;
    const int64_t last_start = val_tokens() - T - 1;
    const int64_t count = std::min<int64_t>(eval_sequences_, last_start + 1);
    std::vector<Batch> batches;
    for (int64_t first = 0; first < count; first += batch_size) {
        std::vector<int64_t> starts(std::min(batch_size, count - first));
        for (int64_t b = 0; b < static_cast<int64_t>(starts.size()); ++b)
            starts[b] = count == 1 ? 0 : (first + b) * last_start / (count - 1);
        batches.push_back(window_batch(val_, starts, T));
    }
    return batches;
}

// ---- character-level text ----

TextCorpus::TextCorpus(const DataOptions& options, const std::string& where)
    : WindowedCorpus(options.seq_len, options.eval_sequences) {
    NL_REQUIRE(!options.path.empty(), where, "/path: a text file is required for source \"text\"");
    std::ifstream in(options.path, std::ios::binary);
    NL_REQUIRE(in.good(), options.path, ": cannot open text file (does it exist?) (", where, "/path)");
    std::stringstream bytes;
    bytes << in.rdbuf();
    std::vector<uint32_t> text = decode_utf8(bytes.str(), options.path);
    NL_REQUIRE(!text.empty(), options.path, ": text file is empty (", where, "/path)");
    NL_REQUIRE(options.val_fraction > 0.0 && options.val_fraction < 1.0, where,
               "/val_fraction: expected a number in (0, 1), got ", options.val_fraction);
    NL_REQUIRE(options.seq_len >= 1, where, "/seq_len: expected an integer >= 1, got ", options.seq_len);

    vocab_ = text;
    std::sort(vocab_.begin(), vocab_.end());
    vocab_.erase(std::unique(vocab_.begin(), vocab_.end()), vocab_.end());
    std::map<uint32_t, uint32_t> id;
    for (size_t i = 0; i < vocab_.size(); ++i) id[vocab_[i]] = static_cast<uint32_t>(i);

    const int64_t n = static_cast<int64_t>(text.size());
    const int64_t n_train = static_cast<int64_t>(std::floor((1.0 - options.val_fraction) * static_cast<double>(n)));
    for (int64_t i = 0; i < n; ++i) (i < n_train ? train_ : val_).push_back(id[text[i]]);
    // One window is seq_len inputs plus the target after the last one.
    const int64_t window = options.seq_len + 1;
    NL_REQUIRE(train_tokens() >= window && val_tokens() >= window, options.path, ": text too short: ", n,
               " characters split into ", train_tokens(), " train and ", val_tokens(),
               " validation, each split needs at least seq_len + 1 = ", window, " (", where, "/seq_len)");
}

std::string TextCorpus::decode(const std::vector<int64_t>& tokens) const {
    return TextVocab(vocab_metadata()).decode(tokens);
}

nlohmann::json TextCorpus::vocab_metadata() const { return nlohmann::json(vocab_); }

TextVocab::TextVocab(const nlohmann::json& codepoints) {
    NL_REQUIRE(codepoints.is_array() && !codepoints.empty(), "text vocab: expected a non-empty list of codepoints");
    // Strictly increasing Unicode scalar values, as TextCorpus makes them: encode() searches the vocab
    // by bisection, and a surrogate or a value past U+10FFFF would decode to invalid UTF-8.
    for (size_t i = 0; i < codepoints.size(); ++i) {
        const auto& cp = codepoints[i];
        const bool scalar = cp.is_number_integer() && (cp.is_number_unsigned() || cp.get<int64_t>() >= 0) &&
                            cp.get<uint64_t>() <= 0x10FFFF &&
                            !(cp.get<uint64_t>() >= 0xD800 && cp.get<uint64_t>() <= 0xDFFF);
        NL_REQUIRE(scalar, "text vocab: entry ", i, ": expected a Unicode codepoint (0 .. 0x10FFFF, not a surrogate), found ",
                   brief_json(cp));
        const uint32_t value = cp.get<uint32_t>();
        NL_REQUIRE(vocab_.empty() || value > vocab_.back(), "text vocab: entry ", i, ": expected codepoints in increasing ",
                   "order without duplicates, found ", value, " after ", vocab_.back());
        vocab_.push_back(value);
    }
}

std::string TextVocab::decode(const std::vector<int64_t>& tokens) const {
    std::vector<uint32_t> codepoints;
    for (int64_t token : tokens) {
        NL_REQUIRE(token >= 0 && token < size(), "text vocab: token ", token, " outside [0, ", size(), ")");
        codepoints.push_back(vocab_[token]);
    }
    return encode_utf8(codepoints);
}

std::vector<int64_t> TextVocab::encode(const std::string& text) const {
    std::vector<int64_t> tokens;
    for (uint32_t cp : decode_utf8(text, "prompt")) {
        auto it = std::lower_bound(vocab_.begin(), vocab_.end(), cp);
        NL_REQUIRE(it != vocab_.end() && *it == cp, "prompt: character '", encode_utf8({cp}),
                   "' is not in the model's vocabulary (", size(), " characters from its training text)");
        tokens.push_back(static_cast<int64_t>(it - vocab_.begin()));
    }
    return tokens;
}

// ---- token files ----

namespace {

std::string dtype_of_width(int64_t width) { return width == 2 ? "uint16" : width == 4 ? "uint32" : "uint8"; }

// The ids `path` holds, from its size alone: every check read_token_file makes before reading.
int64_t token_file_ids(const std::string& path, int64_t width, int64_t min_ids, const std::string& where) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    NL_REQUIRE(fs::exists(status), path, ": cannot open token file (does it exist?) (", where, "/path)");
    NL_REQUIRE(fs::is_regular_file(status), path, ": cannot read token file: not a regular file (", where, "/path)");
    const uintmax_t bytes = fs::file_size(path, ec);
    NL_REQUIRE(!ec, path, ": cannot read token file: ", ec.message(), " (", where, "/path)");
    NL_REQUIRE(bytes > 0, path, ": token file is empty (", where, "/path)");
    const std::string dtype = dtype_of_width(width);
    NL_REQUIRE(bytes % static_cast<uintmax_t>(width) == 0, path, ": ", bytes, " bytes is not a whole number of ", dtype,
               " ids (", width, " bytes each); is ", where, "/dtype = \"", dtype, "\" the type the file was written with?");
    const uintmax_t ids = bytes / static_cast<uintmax_t>(width);
    NL_REQUIRE(ids <= static_cast<uintmax_t>(kMaxTokenFileIds), path, ": ", ids, " ", dtype,
               " ids, above the limit of ", kMaxTokenFileIds, " (2^36) ids per token file");
    NL_REQUIRE(static_cast<int64_t>(ids) >= min_ids, path, ": token file too short: ", ids, " ", dtype,
               " ids, a window needs at least seq_len + 1 = ", min_ids, " (", where, "/seq_len)");
    return static_cast<int64_t>(ids);
}

}  // namespace

int64_t token_dtype_bytes(const std::string& dtype) {
    if (dtype == "uint16") return 2;
    if (dtype == "uint32") return 4;
    throw Error("token files: dtype: expected one of uint16, uint32, got \"" + dtype + "\"");
}

std::vector<uint32_t> read_token_file(const std::string& path, int64_t width, int64_t vocab_size, int64_t min_ids,
                                      const std::string& where) {
    NL_REQUIRE(width == 2 || width == 4, "read_token_file: ids are 2 or 4 bytes wide, got ", width);
    const int64_t count = token_file_ids(path, width, min_ids, where);
    std::ifstream in(path, std::ios::binary);
    NL_REQUIRE(in.good(), path, ": cannot open token file: ", std::strerror(errno), " (", where, "/path)");
    std::vector<uint32_t> ids(static_cast<size_t>(count));
    // A chunk at a time: no second copy of the file in memory; each id checked as it is converted.
    constexpr int64_t kChunkIds = int64_t(1) << 18;
    std::vector<unsigned char> chunk(static_cast<size_t>(kChunkIds * width));
    for (int64_t first = 0; first < count; first += kChunkIds) {
        const int64_t n = std::min(kChunkIds, count - first);
        in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(n * width));
        NL_REQUIRE(in.gcount() == n * width, path, ": read failed at byte ", first * width + in.gcount(), " of ",
                   count * width, " (did the file change while it was read?)");
        for (int64_t i = 0; i < n; ++i) {
            const unsigned char* b = chunk.data() + i * width;  // little-endian, as numpy's tofile on x86 and ARM
            uint32_t id = uint32_t(b[0]) | uint32_t(b[1]) << 8;
            if (width == 4) id |= uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
            if (static_cast<int64_t>(id) >= vocab_size)
                throw Error(detail::concat(path, ": id ", id, " at index ", first + i, " (byte offset ",
                                           (first + i) * width, ") is outside the vocab: ids must be below vocab_size = ",
                                           vocab_size, " (", where, "/vocab_size)"));
            ids[static_cast<size_t>(first + i)] = id;
        }
    }
    return ids;
}

TokenCorpus::TokenCorpus(const DataOptions& options, const std::string& where)
    : WindowedCorpus(options.seq_len, options.eval_sequences), vocab_size_(options.vocab_size) {
    NL_REQUIRE(!options.path.empty(), where, "/path: a directory holding train.bin and val.bin is required for source ",
               "\"tokens\"");
    const std::vector<std::string> dtypes = {"uint16", "uint32"};
    NL_REQUIRE(std::find(dtypes.begin(), dtypes.end(), options.dtype) != dtypes.end(), where,
               "/dtype: expected one of uint16, uint32, got \"", options.dtype, "\"");
    NL_REQUIRE(options.vocab_size >= 1 && options.vocab_size <= kMaxTokenVocab, where,
               "/vocab_size: expected an integer in [1, ", kMaxTokenVocab, "], got ", options.vocab_size);
    NL_REQUIRE(options.seq_len >= 1, where, "/seq_len: expected an integer >= 1, got ", options.seq_len);
    std::error_code ec;
    NL_REQUIRE(std::filesystem::is_directory(options.path, ec), options.path,
               std::filesystem::exists(options.path, ec)
                   ? ": expected a directory holding train.bin and val.bin (nanoGPT's data/<name>/), found a file ("
                   : ": cannot open token directory (does it exist?) (",
               where, "/path)");
    const int64_t width = token_dtype_bytes(options.dtype);
    const int64_t window = options.seq_len + 1;
    const std::string train_path = (std::filesystem::path(options.path) / "train.bin").string();
    const std::string val_path = (std::filesystem::path(options.path) / "val.bin").string();
    // Both files' sizes, and the memory they take as uint32 ids, before either is read.
    const int64_t ids = token_file_ids(train_path, width, window, where) + token_file_ids(val_path, width, window, where);
    require_memory(4.0 * static_cast<double>(ids),
                   detail::concat(where, "/path: ", options.path, "'s train.bin and val.bin (", ids, " ids, held as uint32)"));
    train_ = read_token_file(train_path, width, vocab_size_, window, where);
    val_ = read_token_file(val_path, width, vocab_size_, window, where);
}

std::string TokenCorpus::decode(const std::vector<int64_t>& tokens) const { return TokenIds(vocab_size_).decode(tokens); }

nlohmann::json TokenCorpus::vocab_metadata() const { return TokenIds(vocab_size_).metadata(); }

TokenIds::TokenIds(int64_t vocab_size) : vocab_size_(vocab_size) {
    NL_REQUIRE(vocab_size >= 1 && vocab_size <= kMaxTokenVocab, "token vocab: vocab_size must be in [1, ", kMaxTokenVocab,
               "], found ", vocab_size);
}

TokenIds TokenIds::from_metadata(const nlohmann::json& metadata) {
    // Other keys are left for later versions to add.
    const bool ok = metadata.is_object() && metadata.contains("source") && metadata["source"] == "tokens" &&
                    metadata.contains("vocab_size") && metadata["vocab_size"].is_number_integer();
    NL_REQUIRE(ok, "token vocab: expected {\"source\": \"tokens\", \"vocab_size\": N}, found ", brief_json(metadata));
    const nlohmann::json& size = metadata["vocab_size"];
    NL_REQUIRE(size.is_number_unsigned() && size.get<uint64_t>() >= 1 && size.get<uint64_t>() <= uint64_t(kMaxTokenVocab),
               "token vocab: vocab_size must be in [1, ", kMaxTokenVocab, "], found ", brief_json(size));
    return TokenIds(size.get<int64_t>());
}

nlohmann::json TokenIds::metadata() const { return {{"source", "tokens"}, {"vocab_size", vocab_size_}}; }

std::string TokenIds::decode(const std::vector<int64_t>& tokens) const {
    std::string out;
    for (int64_t token : tokens) {
        NL_REQUIRE(token >= 0 && token < vocab_size_, "token vocab: token ", token, " outside [0, ", vocab_size_, ")");
        if (!out.empty()) out += ' ';
        out += std::to_string(token);
    }
    return out;
}

std::vector<int64_t> TokenIds::encode(const std::string& text) const {
    std::vector<int64_t> tokens;
    std::istringstream words(text);
    std::string word;
    while (words >> word) {
        const bool digits = std::all_of(word.begin(), word.end(), [](char c) { return c >= '0' && c <= '9'; });
        NL_REQUIRE(digits, "prompt: '", word, "' is not a token id (this model was trained on token files: a prompt is ",
                   "decimal ids separated by spaces, \"17 4 255\")");
        // More than 9 digits is past any vocab (kMaxTokenVocab < 10^9) and may not fit an int64.
        const int64_t id = word.size() > 9 ? vocab_size_ : std::stoll(word);
        NL_REQUIRE(id < vocab_size_, "prompt: token id ", word, " is outside the model's vocab [0, ", vocab_size_, ")");
        tokens.push_back(id);
    }
    NL_REQUIRE(!tokens.empty(), "prompt: no token ids (this model was trained on token files: a prompt is decimal ids ",
               "separated by spaces, \"17 4 255\")");
    return tokens;
}

uint64_t training_stream_seed(const DataOptions& options) { return options.seed ^ 0xD1B54A32D192ED03ull; }

std::unique_ptr<Dataset> make_dataset(const DataOptions& options, const std::string& where) {
    if (options.source == "text") return std::make_unique<TextCorpus>(options, where);
    if (options.source == "tokens") return std::make_unique<TokenCorpus>(options, where);
    NL_REQUIRE(options.source == "synthetic", where, "/source: expected synthetic, text or tokens, got \"",
               options.source, "\"");
    return std::make_unique<SyntheticTask>(options, where);
}

}  // namespace nl
