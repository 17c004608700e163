// Training data for `normlab train`: synthetic sequence tasks generated in-process (copy, reverse,
// sort, integer addition), a character-level language model on any UTF-8 text file, and a language
// model on token ids already tokenized into nanoGPT's train.bin / val.bin.
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
//
// Tokens: nanoGPT's data/<name>/prepare.py output, a directory holding train.bin and val.bin, each
// the raw little-endian ids (np.uint16 by default, or uint32), no header. The ids are the tokens;
// there is no tokenizer, so decode() writes them as decimal numbers ("17 4 255").
//
// Text and tokens are both a train and a validation id sequence read as windows (WindowedCorpus):
// training draws random windows of seq_len + 1 from the generator, evaluation scores fixed ones.
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
    std::string source = "synthetic";  // "synthetic", "text" or "tokens"
    // synthetic
    std::string task = "reverse";      // "copy", "reverse", "sort", "add"
    int64_t length = 8;                // symbols per sequence; digits per operand for "add"
    int64_t symbols = 10;              // distinct symbols (copy/reverse/sort; "add" uses 10 digits)
    // text and tokens
    std::string path;                  // text: a UTF-8 text file; tokens: a directory with train.bin, val.bin
    int64_t seq_len = 64;              // tokens per training window
    // text
    double val_fraction = 0.1;         // the last fraction of the file is the validation split
    // tokens
    std::string dtype = "uint16";      // the files' id type: "uint16" (nanoGPT's) or "uint32"
    int64_t vocab_size = 0;            // ids are in [0, vocab_size); required (nanoGPT's meta.pkl holds it)
    // all
    int64_t eval_sequences = 256;      // held-out sequences (synthetic) or windows (text, tokens) per eval
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
    // Tokens as readable text ("3 1 4 | 4 1 3", "12+34=46", the text's characters, or the ids "17 4 255").
    virtual std::string decode(const std::vector<int64_t>& tokens) const = 0;
    // What a checkpoint must keep to decode without the data (the text vocab; for token files
    // {"source": "tokens", "vocab_size": N}); may be empty.
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

// A language model's data: a train and a validation split of token ids, read as windows of seq_len
// inputs and the seq_len next tokens (the window shifted by one). Text and token files share it.
class WindowedCorpus : public Dataset {
public:
    int64_t seq_len() const override { return seq_len_; }
    // batch_size windows starting at uniform random positions of the train split (as nanoGPT's
    // get_batch: starts in [0, train_tokens - seq_len)), one gen.next_below per window.
    Batch train_batch(int64_t batch_size, Generator& gen) override;
    // eval_sequences windows spread evenly over the validation split, the first at 0 and the last
    // at its end (fewer when the split has fewer starts); the same at every call.
    std::vector<Batch> eval_batches(int64_t batch_size) const override;

    int64_t train_tokens() const { return static_cast<int64_t>(train_.size()); }
    int64_t val_tokens() const { return static_cast<int64_t>(val_.size()); }
    const std::vector<uint32_t>& train_ids() const { return train_; }
    const std::vector<uint32_t>& val_ids() const { return val_; }

protected:
    WindowedCorpus(int64_t seq_len, int64_t eval_sequences) : seq_len_(seq_len), eval_sequences_(eval_sequences) {}

    std::vector<uint32_t> train_;  // token ids (every id < vocab_size(); each split holds a window)
    std::vector<uint32_t> val_;

private:
    int64_t seq_len_;
    int64_t eval_sequences_;
};

class TextCorpus : public WindowedCorpus {
public:
    // Reads options.path: a missing or unreadable file, an empty file, invalid UTF-8, or splits too
    // short for one window of seq_len + 1 tokens are each an nl::Error naming the file.
    TextCorpus(const DataOptions& options, const std::string& where = "data");

    int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.size()); }
    std::string decode(const std::vector<int64_t>& tokens) const override;
    nlohmann::json vocab_metadata() const override;  // the vocab's codepoints, in token order

    const std::vector<uint32_t>& vocab() const { return vocab_; }

private:
    std::vector<uint32_t> vocab_;  // token id -> codepoint
};

// A vocab read back from checkpoint metadata: decodes and encodes text without the file.
class TextVocab {
public:
    explicit TextVocab(const nlohmann::json& codepoints);
    std::string decode(const std::vector<int64_t>& tokens) const;
    // Tokens of `text`; a character outside the vocab is an nl::Error naming it.
    std::vector<int64_t> encode(const std::string& text) const;
    int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
    const std::vector<uint32_t>& codepoints() const { return vocab_; }  // token id -> codepoint

private:
    std::vector<uint32_t> vocab_;
};

// ---- token files (nanoGPT's train.bin / val.bin) ----

// Bounds of a token file (docs/limits.md): ids per file, and the vocab size a config may name.
inline constexpr int64_t kMaxTokenFileIds = int64_t(1) << 36;
inline constexpr int64_t kMaxTokenVocab = int64_t(1) << 24;

// Bytes per id of a token file's dtype ("uint16": 2, "uint32": 4); an nl::Error for any other name.
int64_t token_dtype_bytes(const std::string& dtype);

// The ids of one token file, `width` bytes each, little-endian, every one checked to be below
// `vocab_size` as it is read. nl::Error naming the file when it is missing or not a regular file,
// empty, not a whole number of ids, above kMaxTokenFileIds ids, shorter than `min_ids`, or holds an
// id >= vocab_size (its index, byte offset and value). `where` names the config object ("x.json: /data").
std::vector<uint32_t> read_token_file(const std::string& path, int64_t width, int64_t vocab_size, int64_t min_ids,
                                      const std::string& where = "data");

class TokenCorpus : public WindowedCorpus {
public:
    // Reads <options.path>/train.bin (the train split) and val.bin (the validation split), as
    // read_token_file; both files' sizes are checked, and the memory they need against the machine,
    // before either is read.
    TokenCorpus(const DataOptions& options, const std::string& where = "data");

    int64_t vocab_size() const override { return vocab_size_; }
    std::string decode(const std::vector<int64_t>& tokens) const override;  // "17 4 255"
    nlohmann::json vocab_metadata() const override;  // {"source": "tokens", "vocab_size": N}

private:
    int64_t vocab_size_;
};

// The vocab of a model trained on token files, from the config or checkpoint metadata: ids have no
// text, so they are written and read as decimal numbers separated by spaces.
class TokenIds {
public:
    explicit TokenIds(int64_t vocab_size);
    // {"source": "tokens", "vocab_size": N} (TokenCorpus::vocab_metadata); nl::Error for anything else.
    static TokenIds from_metadata(const nlohmann::json& metadata);
    nlohmann::json metadata() const;
    std::string decode(const std::vector<int64_t>& tokens) const;  // "17 4 255"
    // The ids of "17 4 255" (separated by any whitespace); a word that is not a decimal id, or an id
    // outside [0, size()), is an nl::Error naming it. Empty text is an error too.
    std::vector<int64_t> encode(const std::string& text) const;
    int64_t size() const { return vocab_size_; }

private:
    int64_t vocab_size_;
};

// The Philox key of the training batch stream: derived from options.seed so that it differs from
// the held-out stream's key and from the model's init generator (Generator(seed)).
uint64_t training_stream_seed(const DataOptions& options);

// Builds the dataset options.source names.
std::unique_ptr<Dataset> make_dataset(const DataOptions& options, const std::string& where = "data");

}  // namespace nl
