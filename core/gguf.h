// GGUF read/write: llama.cpp's model file format (ggml/docs/gguf.md), so a normlab model runs in
// llama.cpp and normlab starts from a model llama.cpp holds. Format (little-endian):
//   magic "GGUF", u32 version (2 or 3), u64 tensor count, u64 metadata count
//   metadata: count x (string key, u32 value type, value); a string is u64 length + UTF-8 bytes;
//             an array is u32 element type, u64 count, elements (arrays of arrays are refused here)
//   tensor infos: count x (string name, u32 n_dims, n_dims x u64 ne, u32 ggml type, u64 offset)
//   padding to general.alignment (default 32), then the data section; each tensor's offset is
//   relative to its start and a multiple of the alignment.
// ggml lists dimensions fastest first (ne[0] is the row length), so a PyTorch (out, in) weight has
// ne = [in, out]. This API speaks PyTorch's row-major shapes and reverses them in the file.
// Tensor types read and written: F32, F16, BF16, F64; any other ggml type (the quantized ones,
// Q4_0, Q8_0, Q4_K, ...) is refused on load with its name.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace nl {

// GGUF metadata value types (the format's gguf_type numbering).
enum class GgufType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* gguf_type_name(GgufType type);  // "UINT32", "STRING", ...

// One metadata value. Scalars: integers in `integer` (UINT64 values above INT64_MAX are refused
// on load and by u64()), FLOAT32/FLOAT64 in `real`, BOOL in `integer` (0/1), STRING in `text`.
// Arrays: `type` is ARRAY, `element` the element type, and the elements in `texts` (STRING),
// `integers` (integer and BOOL elements) or `reals` (FLOAT32/FLOAT64).
struct GgufValue {
    GgufType type = GgufType::UINT32;
    GgufType element = GgufType::UINT32;  // arrays only
    int64_t integer = 0;
    double real = 0.0;
    std::string text;
    std::vector<std::string> texts;
    std::vector<int64_t> integers;
    std::vector<double> reals;

    static GgufValue u32(uint32_t value);
    static GgufValue i32(int32_t value);
    static GgufValue u64(uint64_t value);
    static GgufValue f32(float value);
    static GgufValue boolean(bool value);
    static GgufValue string(std::string value);
    static GgufValue string_array(std::vector<std::string> values);
    static GgufValue i32_array(std::vector<int64_t> values);   // each must fit int32 (checked on save)
    static GgufValue f32_array(std::vector<double> values);
};

using GgufMetadata = std::vector<std::pair<std::string, GgufValue>>;

// A loaded file: its metadata (file order) and every tensor (CPU, contiguous, the file's dtype,
// row-major shape = the file's ne reversed).
struct GgufFile {
    std::string path;
    uint32_t version = 3;
    uint64_t alignment = 32;
    GgufMetadata metadata;
    std::vector<std::pair<std::string, Tensor>> tensors;

    // null when absent.
    const GgufValue* find(const std::string& key) const;
    // Typed reads; nl::Error naming the file, the key and what was found when the key is missing or
    // of another kind. uint_at accepts any integer type (a negative value is an error), real_at
    // FLOAT32/FLOAT64 (and integers), string_at STRING.
    uint64_t uint_at(const std::string& key) const;
    double real_at(const std::string& key) const;
    const std::string& string_at(const std::string& key) const;

    bool contains_tensor(const std::string& name) const;
    // nl::Error naming the file and the missing tensor.
    const Tensor& tensor(const std::string& name) const;
};

// Writes a GGUF v3 file: `metadata` in the order given (general.alignment, UINT32, is put first when
// `alignment` is not 32; an entry the caller passes must equal `alignment`), then `tensors` (any
// device and strides; F32, F16, BF16 or F64) in the order given, each at an offset that is a multiple
// of `alignment` (a power of two, 8 to 2^31) and padded to it, so the file ends on a multiple of it
// (as ggml and gguf-py write). Keys must be unique, non-empty, at most 65,535 bytes; values must fit
// their types (i32_array elements int32, BOOL 0/1) and scalar strings load_gguf's 1 MiB. Tensor names
// must be unique, 1 to 63 bytes (ggml's GGML_MAX_NAME is 64 with the NUL); 1 to 4 dimensions (ggml's
// GGML_MAX_DIMS). Everything is checked before the file system is touched. Atomic, as
// save_safetensors: `path`.tmp.<pid> fsynced and renamed over `path`; on any error the temp file is
// removed, an existing `path` is left untouched, and nl::Error is thrown.
void save_gguf(const std::string& path, const GgufMetadata& metadata,
               const std::vector<std::pair<std::string, Tensor>>& tensors, uint64_t alignment = 32);

// Reads and validates a whole file (versions 2 and 3; tensor data streamed into the tensors). Every
// count, length, dimension, offset and the alignment is checked against the file's size before
// memory is taken, products that overflow are refused, and a duplicate key or tensor name, a tensor
// outside the data section or overlapping another, an unknown value type, a BOOL other than 0/1, an
// array of arrays or a quantized tensor type (named: "Q4_0") is an nl::Error naming the file, the
// offset, key or tensor, what was expected and what was found. Limits (docs/limits.md): at most
// 1,000,000 metadata entries and 100,000 tensors; keys of at most 65,535 bytes, scalar string values
// of at most 1 MiB (array elements: bounded by the file), tensor names of at most 63 bytes; n_dims 1
// to 4; general.alignment a UINT32 power of two; offsets multiples of it.
// Metadata takes at most a small multiple of the file's size in memory (a UINT8 element becomes an int64).
GgufFile load_gguf(const std::string& path);

// The ggml type name of a tensor type id, as gguf-py spells it ("F32", "Q4_0", ...; ids 0 to 41, the
// removed ones by their old names; "type 123" when unknown).
std::string ggml_type_name(uint32_t type);

}  // namespace nl
