// safetensors read/write: the Hugging Face tensor file format, so checkpoints and PyTorch-made
// fixtures move both ways. Format (https://huggingface.co/docs/safetensors):
//   8 bytes   N, little-endian u64: the JSON header's length
//   N bytes   JSON object {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//             ..., optional "__metadata__": {"key": "value"}}, padded with spaces to a multiple of 8
//   rest      raw little-endian row-major data; offsets are relative to the start of this section,
//             and the tensors cover it exactly, back to back, with nothing left over.
// Supported dtypes: F32, F64, BF16, F16, I64 (the normlab dtypes).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace nl {

// A loaded file: every tensor (CPU, contiguous, the file's exact dtype) plus the free-form metadata.
struct SafeTensorsFile {
    std::string path;
    std::vector<std::pair<std::string, Tensor>> tensors;  // in file (data offset) order
    std::map<std::string, std::string> metadata;          // "__metadata__"; empty when absent

    bool contains(const std::string& name) const;
    // Throws nl::Error naming the file, the missing name and the names present.
    const Tensor& at(const std::string& name) const;
    std::vector<std::string> names() const;  // in file order
};

// Writes `tensors` (any device, any strides: saved contiguous, on the CPU) with PyTorch's layout
// conventions: tensors sorted by dtype alignment (largest first) then name, header padded to a
// multiple of 8. Atomic: writes `path`.tmp.<pid>, fsyncs it, then renames it over `path`; on any
// error the temp file is removed, an existing `path` is left untouched, and nl::Error is thrown.
// Names must be unique, non-reserved ("__metadata__") and valid UTF-8.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and fully validates a file. Any corrupt or truncated input is an nl::Error naming the file,
// what was expected and what was found; sizes are checked against the file size before anything
// is allocated, so a hostile header cannot cause a huge allocation. Limits (docs/limits.md): a
// header of at most 100 MB, JSON padded with spaces only (no NUL bytes), nested at most 64 levels,
// with at most 100,000 tensors, parsed in linear time.
SafeTensorsFile load_safetensors(const std::string& path);
// The same checks, but the tensors are views of one copy-on-write memory map of the file (pages
// read on first touch, shared with the page cache; a write to a tensor stays private) instead of
// copies: for reading large checkpoints without holding them twice. The map lives as long as any
// of its tensors. A tensor whose offset is not a multiple of its element size is copied out.
SafeTensorsFile map_safetensors(const std::string& path);

// The format's dtype strings: "F32", "F64", "BF16", "F16", "I64".
const char* safetensors_dtype_name(DType dtype);

}  // namespace nl
