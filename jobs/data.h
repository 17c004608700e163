// Training data for `normlab train`: synthetic sequence tasks generated in-process (copy, reverse,
// sort, integer addition) and a character-level language model on any UTF-8 text file.
//
// Every example is a token sequence; the model reads seq[0 .. n-2] and predicts seq[1 .. n-1]. A
// target equal to kIgnoreIndex takes no part in the loss (cross_entropy's ignore_index), so the
// synthetic tasks are trained on their answer tokens only.
//
// Synthetic layout (S = data.symbols; for "add" the symbols are the digits 0-9):
//   copy / reverse / sort:  x1 .. xL  SEP  y1 .. yL          SEP = S, vocab S + 1, n = 2L + 1
//   add (L digits each):    a1 .. aL  '+'  b1 .. bL  '='  s0 .. sL
//                           '+' = 10, '=' = 11, vocab 12, n = 3L + 3; the sum a + b is written with
//                           L + 1 digits, LEAST significant first (the order a carry propagates,
//                           so a causal model can emit each digit from the ones it has produced).
// Held-out sequences come from their own generator stream (a different Philox key than training)
// and training never draws a prompt that is in the held-out set, so accuracy is measured on
// sequences the model has not seen.
//
// Text: codepoint-level (one token per Unicode codepoint, as nanoGPT's shakespeare_char; the vocab
// is the sorted set of codepoints present in the file, so "é" is one token, not two bytes). The
// first (1 - val_fraction) of the codepoints train, the rest validate.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "core/tensor.h"

namespace nl {

inline constexpr int64_t kIgnoreIndex = -100;  // PyTorch's cross_entropy default

struct DataOptions {
    std::string source = "synthetic";  // "synthetic" or "text"
    // synthetic
    std::string task = "reverse";      // "copy", "reverse", "sort", "add"
    int64_t length = 8;                // symbols per sequence; digits per operand for "add"
    int64_t symbols = 10;              // distinct symbols (copy/reverse/sort; "add" uses 10 digits)
    // text
    std::string path;                  // a UTF-8 text file
    double val_fraction = 0.1;         // the last fraction of the file is the validation split
    int64_t seq_len = 64;              // tokens per training window
    // both
    int64_t eval_sequences = 256;      // held-out sequences (synthetic) or windows (text) per eval
    uint64_t seed = 0;                 // the data streams' seed
};

// One batch: inputs and next-token targets.
struct Batch {
    Tensor inputs;   // (B, T) i64
    Tensor targets;  // (B, T) i64, kIgnoreIndex where no loss is taken
};

// A prompt (what the model is given) and the answer it must produce after it.
struct Problem {
    std::vector<int64_t> prompt;
    std::vector<int64_t> answer;
};

class Dataset {
public:
    virtual ~Dataset() = default;
    virtual int64_t vocab_size() const = 0;
    // T: the model's input length (one less than a full sequence).
    virtual int64_t seq_len() const = 0;
    // Random training examples drawn from `gen` (the only randomness in a step, so a checkpoint
    // that saves gen resumes the exact same batches).
    virtual Batch train_batch(int64_t batch_size, Generator& gen) = 0;
    // The fixed held-out set, in batches of at most batch_size (the same every call).
    virtual std::vector<Batch> eval_batches(int64_t batch_size) const = 0;
    // Synthetic tasks have right answers, so exact-sequence accuracy; text does not.
    virtual bool has_accuracy() const { return false; }
    // Tokens as readable text ("3 1 4 | 4 1 3", "12+34=46", or the text's characters).
    virtual std::string decode(const std::vector<int64_t>& tokens) const = 0;
    // What a checkpoint must keep to decode without the data (the text vocab); may be empty.
    virtual nlohmann::json vocab_metadata() const { return nullptr; }
};

// ---- synthetic tasks ----

class SyntheticTask : public Dataset {
public:
    // Validates the options (nl::Error naming the field); `where` prefixes messages ("file: /data").
    SyntheticTask(const DataOptions& options, const std::string& where = "data");

    int64_t vocab_size() const override;
    // The vocab size `options` give, without generating the held-out set.
    static int64_t vocab_size_of(const DataOptions& options);
    int64_t seq_len() const override { return prompt_length() + answer_length() - 1; }
    Batch train_batch(int64_t batch_size, Generator& gen) override;
    std::vector<Batch> eval_batches(int64_t batch_size) const override;
    bool has_accuracy() const override { return true; }
    std::string decode(const std::vector<int64_t>& tokens) const override;

    int64_t prompt_length() const;
    int64_t answer_length() const;
    // One random problem (not checked against the held-out set).
    Problem make_problem(Generator& gen) const;
    // The held-out problems (options.eval_sequences of them, distinct).
    const std::vector<Problem>& held_out() const { return held_out_; }
    // A problem's prompt and answer as readable text.
    std::string format_problem(const Problem& problem) const;
    std::string format_answer(const std::vector<int64_t>& answer) const;

private:
    Batch make_batch(const std::vector<Problem>& problems) const;

    DataOptions options_;
    std::vector<Problem> held_out_;
    std::set<std::vector<int64_t>> held_out_prompts_;
};

// ---- character-level text ----

// The UTF-8 codepoints of `bytes`; nl::Error naming `path` and the byte offset of invalid UTF-8.
std::vector<uint32_t> decode_utf8(const std::string& bytes, const std::string& path);
std::string encode_utf8(const std::vector<uint32_t>& codepoints);

class TextCorpus : public Dataset {
public:
    // Reads options.path: a missing or unreadable file, an empty file, invalid UTF-8, or splits too
    // short for one window of seq_len + 1 tokens are each an nl::Error naming the file.
    TextCorpus(const DataOptions& options, const std::string& where = "data");

    int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.size()); }
    int64_t seq_len() const override { return options_.seq_len; }
    Batch train_batch(int64_t batch_size, Generator& gen) override;
    std::vector<Batch> eval_batches(int64_t batch_size) const override;
    std::string decode(const std::vector<int64_t>& tokens) const override;
    nlohmann::json vocab_metadata() const override;  // the vocab's codepoints, in token order

    const std::vector<uint32_t>& vocab() const { return vocab_; }
    int64_t train_tokens() const { return static_cast<int64_t>(train_.size()); }
    int64_t val_tokens() const { return static_cast<int64_t>(val_.size()); }

private:
    DataOptions options_;
    std::vector<uint32_t> vocab_;  // token id -> codepoint
    std::vector<int64_t> train_;   // token ids
    std::vector<int64_t> val_;
};

// A vocab read back from checkpoint metadata: decodes and encodes text without the file.
class TextVocab {
public:
    explicit TextVocab(const nlohmann::json& codepoints);
    std::string decode(const std::vector<int64_t>& tokens) const;
    // Tokens of `text`; a character outside the vocab is an nl::Error naming it.
    std::vector<int64_t> encode(const std::string& text) const;
    int64_t size() const { return static_cast<int64_t>(vocab_.size()); }

private:
    std::vector<uint32_t> vocab_;
};

// The Philox key of the training batch stream: derived from options.seed so that it differs from
// the held-out stream's key and from the model's init generator (Generator(seed)).
uint64_t training_stream_seed(const DataOptions& options);

// Builds the dataset options.source names.
std::unique_ptr<Dataset> make_dataset(const DataOptions& options, const std::string& where = "data");

}  // namespace nl
