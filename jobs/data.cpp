// Synthetic sequence tasks and character-level text for `normlab train` (see data.h for the layouts).
#include "jobs/data.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/json_parse.h"

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

// ---- character-level text ----

TextCorpus::TextCorpus(const DataOptions& options, const std::string& where) : options_(options) {
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
    std::map<uint32_t, int64_t> id;
    for (size_t i = 0; i < vocab_.size(); ++i) id[vocab_[i]] = static_cast<int64_t>(i);

    const int64_t n = static_cast<int64_t>(text.size());
    const int64_t n_train = static_cast<int64_t>(std::floor((1.0 - options.val_fraction) * static_cast<double>(n)));
    for (int64_t i = 0; i < n; ++i) (i < n_train ? train_ : val_).push_back(id[text[i]]);
    // One window is seq_len inputs plus the target after the last one.
    const int64_t window = options.seq_len + 1;
    NL_REQUIRE(train_tokens() >= window && val_tokens() >= window, options.path, ": text too short: ", n,
               " characters split into ", train_tokens(), " train and ", val_tokens(),
               " validation, each split needs at least seq_len + 1 = ", window, " (", where, "/seq_len)");
}

Batch TextCorpus::train_batch(int64_t batch_size, Generator& gen) {
    const int64_t B = batch_size;
    const int64_t T = options_.seq_len;
    std::vector<int64_t> inputs(B * T), targets(B * T);  // (B, T) each
    const uint64_t starts = static_cast<uint64_t>(train_tokens() - T);  // windows [s, s + T] fit
    for (int64_t b = 0; b < B; ++b) {
        int64_t s = static_cast<int64_t>(gen.next_below(starts));
        for (int64_t t = 0; t < T; ++t) {
            inputs[b * T + t] = train_[s + t];
            targets[b * T + t] = train_[s + t + 1];
        }
    }
    return {from_vector(inputs, {B, T}), from_vector(targets, {B, T})};
}

std::vector<Batch> TextCorpus::eval_batches(int64_t batch_size) const {
    // eval_sequences windows spread evenly over the validation split (no randomness: every eval
    // scores the same windows, so val losses are comparable across steps and runs).
    const int64_t T = options_.seq_len;
    const int64_t last_start = val_tokens() - T - 1;
    const int64_t count = std::min<int64_t>(options_.eval_sequences, last_start + 1);
    std::vector<Batch> batches;
    for (int64_t first = 0; first < count; first += batch_size) {
        const int64_t B = std::min(batch_size, count - first);
        std::vector<int64_t> inputs(B * T), targets(B * T);  // (B, T) each
        for (int64_t b = 0; b < B; ++b) {
            int64_t s = count == 1 ? 0 : (first + b) * last_start / (count - 1);
            for (int64_t t = 0; t < T; ++t) {
                inputs[b * T + t] = val_[s + t];
                targets[b * T + t] = val_[s + t + 1];
            }
        }
        batches.push_back({from_vector(inputs, {B, T}), from_vector(targets, {B, T})});
    }
    return batches;
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

uint64_t training_stream_seed(const DataOptions& options) { return options.seed ^ 0xD1B54A32D192ED03ull; }

std::unique_ptr<Dataset> make_dataset(const DataOptions& options, const std::string& where) {
    if (options.source == "text") return std::make_unique<TextCorpus>(options, where);
    NL_REQUIRE(options.source == "synthetic", where, "/source: expected synthetic or text, got \"",
               options.source, "\"");
    return std::make_unique<SyntheticTask>(options, where);
}

}  // namespace nl
