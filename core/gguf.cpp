// GGUF read/write: the layout of ggml/docs/gguf.md, the checks of ggml's own reader (ggml/src/gguf.cpp,
// gguf_init_from_file_impl) and the padding of its writers (gguf_write_to_file and gguf-py's GGUFWriter:
// the data section and every tensor padded to the alignment, so the file ends on a multiple of it).
#include "core/gguf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace nl {

// Values and tensor data are copied byte for byte, which is only right on a little-endian host.
static_assert(std::endian::native == std::endian::little, "gguf: a little-endian host is assumed");

namespace {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint64_t kDefaultAlignment = 32;
const std::string kAlignmentKey = "general.alignment";

// Bounds on what a file may claim (docs/limits.md). Every count and length is also checked against
// the bytes left in the file before it sizes an allocation; these limits keep a merely large header
// (millions of tiny entries) from taking seconds and gigabytes. Real models hold a few hundred
// tensors and a few dozen metadata entries (a tokenizer's vocabulary is one array entry).
constexpr uint64_t kMaxTensors = 100'000;
constexpr uint64_t kMaxMetadata = 1'000'000;
// A scalar STRING value; array elements are bounded only by the file (a vocabulary is one array).
constexpr uint64_t kMaxStringBytes = uint64_t(1) << 20;
constexpr uint64_t kMaxKeyBytes = 65535;  // the spec: "at most 2^16-1/65535 bytes long"
constexpr uint64_t kMaxNameBytes = 63;    // ggml's GGML_MAX_NAME is 64 with the terminating NUL
constexpr uint32_t kMaxDims = 4;          // ggml's GGML_MAX_DIMS
// The writer's alignment is written as a UINT32; the spec wants a multiple of 8.
constexpr uint64_t kMinWriteAlignment = 8;
constexpr uint64_t kMaxWriteAlignment = uint64_t(1) << 31;

// ---- ggml tensor types ----

enum class GgmlKind { Float, Integer, Quantized };
struct GgmlTypeInfo {
    const char* name;
    GgmlKind kind;
};
// Indexed by ggml type id (ggml/include/ggml.h, enum ggml_type). Ids 4, 5, 31-33 and 36-38 were
// removed from ggml (their commented-out names are kept, so an old file is refused by name); 40 and
// 41 are newer than the spec's table.
constexpr GgmlTypeInfo kGgmlTypes[] = {
    {"F32", GgmlKind::Float},          {"F16", GgmlKind::Float},          {"Q4_0", GgmlKind::Quantized},
    {"Q4_1", GgmlKind::Quantized},     {"Q4_2", GgmlKind::Quantized},     {"Q4_3", GgmlKind::Quantized},
    {"Q5_0", GgmlKind::Quantized},     {"Q5_1", GgmlKind::Quantized},     {"Q8_0", GgmlKind::Quantized},
    {"Q8_1", GgmlKind::Quantized},     {"Q2_K", GgmlKind::Quantized},     {"Q3_K", GgmlKind::Quantized},
    {"Q4_K", GgmlKind::Quantized},     {"Q5_K", GgmlKind::Quantized},     {"Q6_K", GgmlKind::Quantized},
    {"Q8_K", GgmlKind::Quantized},     {"IQ2_XXS", GgmlKind::Quantized},  {"IQ2_XS", GgmlKind::Quantized},
    {"IQ3_XXS", GgmlKind::Quantized},  {"IQ1_S", GgmlKind::Quantized},    {"IQ4_NL", GgmlKind::Quantized},
    {"IQ3_S", GgmlKind::Quantized},    {"IQ2_S", GgmlKind::Quantized},    {"IQ4_XS", GgmlKind::Quantized},
    {"I8", GgmlKind::Integer},         {"I16", GgmlKind::Integer},        {"I32", GgmlKind::Integer},
    {"I64", GgmlKind::Integer},        {"F64", GgmlKind::Float},          {"IQ1_M", GgmlKind::Quantized},
    {"BF16", GgmlKind::Float},         {"Q4_0_4_4", GgmlKind::Quantized}, {"Q4_0_4_8", GgmlKind::Quantized},
    {"Q4_0_8_8", GgmlKind::Quantized}, {"TQ1_0", GgmlKind::Quantized},    {"TQ2_0", GgmlKind::Quantized},
    {"IQ4_NL_4_4", GgmlKind::Quantized}, {"IQ4_NL_4_8", GgmlKind::Quantized}, {"IQ4_NL_8_8", GgmlKind::Quantized},
    {"MXFP4", GgmlKind::Quantized},    {"NVFP4", GgmlKind::Quantized},    {"Q1_0", GgmlKind::Quantized},
};
constexpr uint32_t kGgmlTypeCount = sizeof(kGgmlTypes) / sizeof(kGgmlTypes[0]);

// The normlab dtypes that are ggml types, with their ggml ids.
struct DTypeMapping {
    DType dtype;
    uint32_t ggml;
};
constexpr DTypeMapping kDTypes[] = {{DType::F32, 0}, {DType::F16, 1}, {DType::F64, 28}, {DType::BF16, 30}};
constexpr const char* kDTypesRead = "F32, F16, BF16 and F64";

bool dtype_of_ggml(uint32_t ggml, DType& out) {
    for (const DTypeMapping& m : kDTypes)
        if (m.ggml == ggml) {
            out = m.dtype;
            return true;
        }
    return false;
}

bool ggml_of_dtype(DType dtype, uint32_t& out) {
    for (const DTypeMapping& m : kDTypes)
        if (m.dtype == dtype) {
            out = m.ggml;
            return true;
        }
    return false;
}

// ---- metadata value types ----

constexpr uint32_t kGgufTypeCount = 13;

bool is_integer(GgufType type) {
    switch (type) {
        case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
        case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64:
            return true;
        default:
            return false;
    }
}
bool is_real(GgufType type) { return type == GgufType::FLOAT32 || type == GgufType::FLOAT64; }
// Held in GgufValue::integer / integers: the integer types and BOOL.
bool is_integral(GgufType type) { return is_integer(type) || type == GgufType::BOOL; }

// Bytes of one value of a fixed-size type; a STRING's u64 length prefix (its least size) for STRING.
uint64_t least_size(GgufType type) {
    switch (type) {
        case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
        case GgufType::UINT16: case GgufType::INT16: return 2;
        case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
        case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: case GgufType::STRING: return 8;
        case GgufType::ARRAY: break;
    }
    NL_CHECK(false, "least_size of ", gguf_type_name(type));
    return 0;
}

// The range an integral type holds, as int64 (UINT64 is limited to int64's range: GgufValue's).
void integral_range(GgufType type, int64_t& low, int64_t& high) {
    switch (type) {
        case GgufType::UINT8: low = 0, high = UINT8_MAX; return;
        case GgufType::INT8: low = INT8_MIN, high = INT8_MAX; return;
        case GgufType::UINT16: low = 0, high = UINT16_MAX; return;
        case GgufType::INT16: low = INT16_MIN, high = INT16_MAX; return;
        case GgufType::UINT32: low = 0, high = UINT32_MAX; return;
        case GgufType::INT32: low = INT32_MIN, high = INT32_MAX; return;
        case GgufType::UINT64: low = 0, high = INT64_MAX; return;
        case GgufType::INT64: low = INT64_MIN, high = INT64_MAX; return;
        case GgufType::BOOL: low = 0, high = 1; return;
        default: break;
    }
    NL_CHECK(false, "integral_range of ", gguf_type_name(type));
}

// "UINT32", or "ARRAY of STRING" for an array.
std::string describe(const GgufValue& value) {
    if (value.type != GgufType::ARRAY) return gguf_type_name(value.type);
    return std::string("ARRAY of ") + gguf_type_name(value.element);
}

uint64_t align_up(uint64_t offset, uint64_t alignment) { return (offset + alignment - 1) / alignment * alignment; }

std::string errno_text() { return std::strerror(errno); }

// ---- reading ----

// The file, front to back through a buffered stream. Every read is checked against the bytes left, so
// a length or count from the file is compared with the file's size before it sizes anything.
class Reader {
public:
    Reader(std::ifstream& in, uint64_t size) : in_(in), size_(size) {}

    uint64_t offset() const { return offset_; }
    uint64_t left() const { return size_ - offset_; }

    // `what` names the field in the error ("the tensor count").
    void read(void* out, uint64_t n, const char* what) {
        NL_REQUIRE(n <= left(), "truncated at offset ", offset_, ": expected ", n, " bytes (", what, "), found ",
                   left());
        in_.read(static_cast<char*>(out), static_cast<std::streamsize>(n));
        NL_REQUIRE(in_.good(), "cannot read ", n, " bytes at offset ", offset_, " (", what, ")");
        offset_ += n;
    }

    template <typename T>
    T scalar(const char* what) {
        T value;
        read(&value, sizeof(T), what);
        return value;
    }

    // A u64 length, then that many bytes; the length is checked against `max` and the bytes left
    // before the string is allocated.
    std::string string(uint64_t max, const char* what) {
        const uint64_t at = offset_;
        const uint64_t n = scalar<uint64_t>(what);
        NL_REQUIRE(n <= max, what, " at offset ", at, " is ", n, " bytes long, more than the limit of ", max,
                   " bytes");
        NL_REQUIRE(n <= left(), what, " at offset ", at, " is ", n, " bytes long, but only ", left(),
                   " bytes are left in the file");
        std::string text(n, '\0');
        read(text.data(), n, what);
        return text;
    }

private:
    std::ifstream& in_;
    uint64_t size_;
    uint64_t offset_ = 0;
};

// A u32 value type, refused unless it is one of the format's 13.
GgufType read_type(Reader& r, const char* what) {
    const uint64_t at = r.offset();
    const uint32_t type = r.scalar<uint32_t>(what);
    NL_REQUIRE(type < kGgufTypeCount, "unknown value type ", type, " at offset ", at, " (expected 0 to ",
               kGgufTypeCount - 1, ": UINT8 ... FLOAT64)");
    return static_cast<GgufType>(type);
}

// One integer or BOOL value, widened to int64.
int64_t read_integral(Reader& r, GgufType type) {
    const uint64_t at = r.offset();
    switch (type) {
        case GgufType::UINT8: return r.scalar<uint8_t>("a UINT8 value");
        case GgufType::INT8: return r.scalar<int8_t>("an INT8 value");
        case GgufType::UINT16: return r.scalar<uint16_t>("a UINT16 value");
        case GgufType::INT16: return r.scalar<int16_t>("an INT16 value");
        case GgufType::UINT32: return r.scalar<uint32_t>("a UINT32 value");
        case GgufType::INT32: return r.scalar<int32_t>("an INT32 value");
        case GgufType::INT64: return r.scalar<int64_t>("an INT64 value");
        case GgufType::UINT64: {
            const uint64_t value = r.scalar<uint64_t>("a UINT64 value");
            NL_REQUIRE(value <= uint64_t(INT64_MAX), "UINT64 value ", value, " at offset ", at,
                       " is above 2^63 - 1, the most normlab's GgufValue holds");
            return static_cast<int64_t>(value);
        }
        case GgufType::BOOL: {
            // The spec: "0 is false and 1 is true. Anything else is invalid".
            const uint8_t value = r.scalar<uint8_t>("a BOOL value");
            NL_REQUIRE(value <= 1, "BOOL value ", int(value), " at offset ", at, " (expected 0 or 1)");
            return value;
        }
        default: break;
    }
    NL_CHECK(false, "read_integral of ", gguf_type_name(type));
    return 0;
}

double read_real(Reader& r, GgufType type) {
    if (type == GgufType::FLOAT32) return r.scalar<float>("a FLOAT32 value");
    return r.scalar<double>("a FLOAT64 value");
}

// An ARRAY value after its type: element type, u64 count, elements.
void read_array(Reader& r, GgufValue& value) {
    value.element = read_type(r, "the array's element type");
    NL_REQUIRE(value.element != GgufType::ARRAY, "an array of arrays at offset ", r.offset() - 4,
               ": arrays of arrays are not supported");
    const uint64_t at = r.offset();
    const uint64_t count = r.scalar<uint64_t>("the array's element count");
    const uint64_t least = least_size(value.element);
    NL_REQUIRE(count <= r.left() / least, "array of ", gguf_type_name(value.element), " at offset ", at, " claims ",
               count, " elements (at least ", least, " bytes each), but only ", r.left(),
               " bytes are left in the file");
    // The check above bounds these by the file's size.
    if (value.element == GgufType::STRING) value.texts.reserve(count);
    else if (is_real(value.element)) value.reals.reserve(count);
    else value.integers.reserve(count);
    for (uint64_t i = 0; i < count; ++i) {
        try {
            if (value.element == GgufType::STRING)
                value.texts.push_back(r.string(std::numeric_limits<uint64_t>::max(), "a string element"));
            else if (is_real(value.element))
                value.reals.push_back(read_real(r, value.element));
            else
                value.integers.push_back(read_integral(r, value.element));
        } catch (const Error& e) {
            throw Error(detail::concat("element ", i, " of ", count, ": ", e.what()));
        }
    }
}

GgufValue read_value(Reader& r) {
    GgufValue value;
    value.type = read_type(r, "the value type");
    if (value.type == GgufType::ARRAY) read_array(r, value);
    else if (value.type == GgufType::STRING) value.text = r.string(kMaxStringBytes, "a string value");
    else if (is_real(value.type)) value.real = read_real(r, value.type);
    else value.integer = read_integral(r, value.type);
    return value;
}

// The header's magic, version and counts.
struct Header {
    uint32_t version = 0;
    uint64_t tensors = 0;
    uint64_t metadata = 0;
};

Header read_header(Reader& r) {
    char magic[4];
    r.read(magic, 4, "the magic \"GGUF\"");
    if (std::memcmp(magic, kMagic, 4) != 0) {
        char found[16];
        std::snprintf(found, sizeof(found), "%02x %02x %02x %02x", static_cast<unsigned char>(magic[0]),
                      static_cast<unsigned char>(magic[1]), static_cast<unsigned char>(magic[2]),
                      static_cast<unsigned char>(magic[3]));
        throw Error(detail::concat("not a GGUF file: expected the magic \"GGUF\" (47 47 55 46), found ", found));
    }
    Header header;
    header.version = r.scalar<uint32_t>("the version");
    // Version 1 had 32-bit counts and lengths; ggml dropped it too.
    NL_REQUIRE(header.version != 1, "GGUF version 1 is not supported (its counts are 32-bit); expected version 2 or 3");
    // A big-endian file's version 3 reads as 0x03000000 here (ggml's hint).
    NL_REQUIRE(header.version == 0 || (header.version & 0xffff) != 0, "GGUF version ", header.version,
               " looks byte-swapped: a big-endian file? normlab reads little-endian GGUF (version 2 or 3)");
    NL_REQUIRE(header.version == 2 || header.version == 3, "unsupported GGUF version ", header.version,
               " (expected 2 or 3)");
    header.tensors = r.scalar<uint64_t>("the tensor count");
    NL_REQUIRE(header.tensors <= kMaxTensors, "the tensor count ", header.tensors, " exceeds the limit of ",
               kMaxTensors);
    header.metadata = r.scalar<uint64_t>("the metadata count");
    NL_REQUIRE(header.metadata <= kMaxMetadata, "the metadata count ", header.metadata, " exceeds the limit of ",
               kMaxMetadata);
    return header;
}

GgufMetadata read_metadata(Reader& r, uint64_t count) {
    GgufMetadata metadata;
    std::unordered_map<std::string, uint64_t> seen;  // key -> entry index, for duplicates
    for (uint64_t i = 0; i < count; ++i) {
        std::string key;
        try {
            key = r.string(kMaxKeyBytes, "the key");
        } catch (const Error& e) {
            throw Error(detail::concat("metadata entry ", i, ": ", e.what()));
        }
        NL_REQUIRE(!key.empty(), "metadata entry ", i, " has an empty key");
        const auto [it, fresh] = seen.emplace(key, i);
        NL_REQUIRE(fresh, "duplicate metadata key '", key, "' (entries ", it->second, " and ", i, ")");
        GgufValue value;
        try {
            value = read_value(r);
        } catch (const Error& e) {
            throw Error(detail::concat("metadata key '", key, "': ", e.what()));
        }
        metadata.emplace_back(std::move(key), std::move(value));
    }
    return metadata;
}

// general.alignment: a UINT32 power of two (as ggml reads it), 32 when absent.
uint64_t alignment_of(const GgufMetadata& metadata) {
    for (const auto& [key, value] : metadata) {
        if (key != kAlignmentKey) continue;
        NL_REQUIRE(value.type == GgufType::UINT32, kAlignmentKey, " must be UINT32, found ", describe(value));
        NL_REQUIRE(value.integer > 0 && std::has_single_bit(static_cast<uint64_t>(value.integer)), kAlignmentKey,
                   " is ", value.integer, "; expected a power of two");
        return static_cast<uint64_t>(value.integer);
    }
    return kDefaultAlignment;
}

struct TensorInfo {
    std::string name;
    Shape shape;  // row-major: the file's ne reversed
    DType dtype = DType::F32;
    uint32_t ggml_type = 0;
    uint64_t offset = 0;  // in the data section
    uint64_t nbytes = 0;
    bool nbytes_fit = true;  // false when numel * dtype size overflows a u64
};

// Throws (naming the type) unless ggml type `type` is a normlab dtype.
DType dtype_of_tensor_type(uint32_t type) {
    DType dtype;
    if (dtype_of_ggml(type, dtype)) return dtype;
    NL_REQUIRE(type < kGgmlTypeCount, "has unknown ggml type ", type, "; normlab reads ", kDTypesRead);
    const char* kind = kGgmlTypes[type].kind == GgmlKind::Quantized ? " (quantized)" : " (integer)";
    throw Error(detail::concat("has ggml type ", kGgmlTypes[type].name, kind, "; normlab reads ", kDTypesRead));
}

// n_dims, ne[n_dims] (fastest first), ggml type, offset.
void read_tensor_shape_type_offset(Reader& r, TensorInfo& info, uint64_t alignment) {
    const uint32_t n_dims = r.scalar<uint32_t>("n_dims");
    NL_REQUIRE(n_dims >= 1 && n_dims <= kMaxDims, "has n_dims ", n_dims, "; expected 1 to ", kMaxDims,
               " (ggml's GGML_MAX_DIMS)");
    Shape ne(n_dims);
    for (uint32_t j = 0; j < n_dims; ++j) {
        const uint64_t size = r.scalar<uint64_t>("a dimension");
        NL_REQUIRE(size <= uint64_t(INT64_MAX), "dimension ne[", j, "] is ", size, ", above 2^63 - 1");
        ne[j] = static_cast<int64_t>(size);
    }
    info.shape.assign(ne.rbegin(), ne.rend());
    // ggml wants the element count to fit int64. The product of the non-zero dimensions must fit too,
    // stricter than ggml for an empty tensor ([2^62, 2^62, 0]): its row-major strides and extent are
    // computed over those, and would overflow.
    Shape nonzero(ne.size());
    std::transform(ne.begin(), ne.end(), nonzero.begin(), [](int64_t n) { return std::max<int64_t>(n, 1); });
    int64_t numel = 0;
    NL_REQUIRE(checked_shape_numel(nonzero, numel), "has ne ", shape_str(ne),
               ": the product of the dimensions overflows int64");
    if (std::find(ne.begin(), ne.end(), 0) != ne.end()) numel = 0;
    info.ggml_type = r.scalar<uint32_t>("the ggml type");
    info.dtype = dtype_of_tensor_type(info.ggml_type);
    uint64_t nbytes = 0;
    info.nbytes_fit = !__builtin_mul_overflow(static_cast<uint64_t>(numel), dtype_size(info.dtype), &nbytes);
    info.nbytes = nbytes;
    info.offset = r.scalar<uint64_t>("the data offset");
    NL_REQUIRE(info.offset % alignment == 0, "has offset ", info.offset, ", not a multiple of the alignment ",
               alignment);
}

std::vector<TensorInfo> read_tensor_infos(Reader& r, uint64_t count, uint64_t alignment) {
    std::vector<TensorInfo> infos;
    std::unordered_map<std::string, uint64_t> seen;  // name -> tensor index, for duplicates
    for (uint64_t i = 0; i < count; ++i) {
        TensorInfo info;
        try {
            info.name = r.string(kMaxNameBytes, "the tensor name");
        } catch (const Error& e) {
            throw Error(detail::concat("tensor info ", i, ": ", e.what()));
        }
        const auto [it, fresh] = seen.emplace(info.name, i);
        NL_REQUIRE(fresh, "duplicate tensor name '", info.name, "' (tensors ", it->second, " and ", i, ")");
        try {
            read_tensor_shape_type_offset(r, info, alignment);
        } catch (const Error& e) {
            throw Error(detail::concat("tensor '", info.name, "' ", e.what()));
        }
        infos.push_back(std::move(info));
    }
    return infos;
}

// Each tensor's bytes inside the data section (data_size bytes), and no two tensors sharing a byte.
void check_data_layout(const std::vector<TensorInfo>& infos, uint64_t data_size) {
    for (const TensorInfo& info : infos) {
        const bool inside = info.nbytes_fit && info.offset <= data_size && info.nbytes <= data_size - info.offset;
        NL_REQUIRE(inside, "tensor '", info.name, "' (", ggml_type_name(info.ggml_type), " ", shape_str(info.shape),
                   ") at offset ", info.offset, " needs ",
                   info.nbytes_fit ? std::to_string(info.nbytes) : std::string("an overflowing number of"),
                   " bytes, past the end of the data section (", data_size, " bytes): truncated or corrupt");
    }
    std::vector<size_t> order(infos.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return infos[a].offset < infos[b].offset; });
    const TensorInfo* previous = nullptr;  // the non-empty tensor that ends last so far
    for (size_t index : order) {
        const TensorInfo& info = infos[index];
        if (info.nbytes == 0) continue;  // an empty tensor holds no byte to share
        if (previous != nullptr) {
            const uint64_t previous_end = previous->offset + previous->nbytes;
            NL_REQUIRE(info.offset >= previous_end, "tensors '", previous->name, "' (bytes ", previous->offset,
                       " to ", previous_end, ") and '", info.name, "' (bytes ", info.offset, " to ",
                       info.offset + info.nbytes, ") overlap in the data section");
        }
        previous = &info;
    }
}

GgufFile load(const std::string& path) {
    struct stat st {};
    NL_REQUIRE(::stat(path.c_str(), &st) == 0, "cannot open: ", errno_text());
    NL_REQUIRE(S_ISREG(st.st_mode), "not a regular file");
    std::ifstream in(path, std::ios::binary);
    NL_REQUIRE(in.good(), "cannot open: ", errno_text());
    const uint64_t file_size = static_cast<uint64_t>(st.st_size);
    Reader r(in, file_size);

    const Header header = read_header(r);
    GgufFile file;
    file.path = path;
    file.version = header.version;
    file.metadata = read_metadata(r, header.metadata);
    file.alignment = alignment_of(file.metadata);
    const std::vector<TensorInfo> infos = read_tensor_infos(r, header.tensors, file.alignment);

    // The data section starts at the next multiple of the alignment (ggml skips this for a file
    // without tensors, which may end right after its metadata).
    const uint64_t data_start = align_up(r.offset(), file.alignment);
    if (infos.empty()) return file;
    NL_REQUIRE(data_start <= file_size, "the data section starts at offset ", data_start,
               " (the tensor infos end at ", r.offset(), ", padded to the alignment ", file.alignment,
               "), past the end of the file (", file_size, " bytes): truncated");
    check_data_layout(infos, file_size - data_start);

    // Every size is now bounded by the file's, so the allocations are safe.
    for (const TensorInfo& info : infos) {
        Tensor tensor = Tensor::empty(info.shape, info.dtype);
        if (info.nbytes > 0) {
            in.seekg(static_cast<std::streamoff>(data_start + info.offset));
            in.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(info.nbytes));
            NL_REQUIRE(in.good(), "cannot read the ", info.nbytes, " bytes of tensor '", info.name, "'");
        }
        file.tensors.emplace_back(info.name, std::move(tensor));
    }
    return file;
}

// ---- writing ----

template <typename T>
void put(std::string& out, T value) {
    out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void put_string(std::string& out, const std::string& text) {
    put<uint64_t>(out, text.size());
    out += text;
}

// One integral value in its type's width; the range was checked by check_integral.
void put_integral(std::string& out, GgufType type, int64_t value) {
    switch (least_size(type)) {
        case 1: put<uint8_t>(out, static_cast<uint8_t>(value)); return;
        case 2: put<uint16_t>(out, static_cast<uint16_t>(value)); return;
        case 4: put<uint32_t>(out, static_cast<uint32_t>(value)); return;
        default: put<uint64_t>(out, static_cast<uint64_t>(value)); return;
    }
}

void put_real(std::string& out, GgufType type, double value) {
    if (type == GgufType::FLOAT32) put<float>(out, static_cast<float>(value));
    else put<double>(out, value);
}

// Throws unless `value` fits `type`; `element` is the array index, or -1 for a scalar.
void check_integral(GgufType type, int64_t value, int64_t element) {
    int64_t low = 0, high = 0;
    integral_range(type, low, high);
    if (value >= low && value <= high) return;
    const std::string what = element < 0 ? "value" : detail::concat("element ", element);
    throw Error(detail::concat(what, " ", value, " does not fit ", gguf_type_name(type), " (", low, " to ", high,
                               ")"));
}

bool valid_type(GgufType type) { return static_cast<uint32_t>(type) < kGgufTypeCount; }

// An array's elements live in the vector of its element type; a value filled into another vector
// would be written as an empty array without this check.
void check_array_vectors(const GgufValue& value) {
    const bool text = value.element == GgufType::STRING, real = is_real(value.element);
    const bool integral = !text && !real;
    NL_REQUIRE((text || value.texts.empty()) && (real || value.reals.empty()) &&
                   (integral || value.integers.empty()),
               "an ARRAY of ", gguf_type_name(value.element), " keeps its elements in `",
               text ? "texts" : real ? "reals" : "integers", "`, but other element vectors are filled");
}

// The value after the key: type, then the value (an array: element type, count, elements).
void put_value(std::string& out, const GgufValue& value) {
    NL_REQUIRE(valid_type(value.type), "unknown value type ", static_cast<uint32_t>(value.type));
    put<uint32_t>(out, static_cast<uint32_t>(value.type));
    if (value.type == GgufType::STRING) {
        NL_REQUIRE(value.text.size() <= kMaxStringBytes, "the string value is ", value.text.size(),
                   " bytes long, more than the limit of ", kMaxStringBytes, " bytes (load_gguf's)");
        put_string(out, value.text);
    } else if (is_real(value.type)) {
        put_real(out, value.type, value.real);
    } else if (is_integral(value.type)) {
        check_integral(value.type, value.integer, -1);
        put_integral(out, value.type, value.integer);
    } else {  // ARRAY
        NL_REQUIRE(valid_type(value.element), "unknown array element type ", static_cast<uint32_t>(value.element));
        NL_REQUIRE(value.element != GgufType::ARRAY, "arrays of arrays are not supported");
        check_array_vectors(value);
        put<uint32_t>(out, static_cast<uint32_t>(value.element));
        if (value.element == GgufType::STRING) {
            put<uint64_t>(out, value.texts.size());
            for (const std::string& text : value.texts) put_string(out, text);
        } else if (is_real(value.element)) {
            put<uint64_t>(out, value.reals.size());
            for (double real : value.reals) put_real(out, value.element, real);
        } else {
            put<uint64_t>(out, value.integers.size());
            for (size_t i = 0; i < value.integers.size(); ++i) {
                check_integral(value.element, value.integers[i], static_cast<int64_t>(i));
                put_integral(out, value.element, value.integers[i]);
            }
        }
    }
}

// The metadata as written: general.alignment first when the alignment is not the default and the
// caller did not pass it (a caller's entry must agree with `alignment`: a loaded file's metadata
// saves back as it was).
GgufMetadata metadata_to_write(const GgufMetadata& metadata, uint64_t alignment) {
    GgufMetadata out;
    bool has_alignment = false;
    for (const auto& [key, value] : metadata) {
        if (key != kAlignmentKey) continue;
        NL_REQUIRE(value.type == GgufType::UINT32 && static_cast<uint64_t>(value.integer) == alignment,
                   "metadata ", kAlignmentKey, " is ", describe(value), " ", value.integer,
                   ", but the alignment argument is ", alignment, " (leave it out: save_gguf writes it)");
        has_alignment = true;
    }
    if (!has_alignment && alignment != kDefaultAlignment)
        out.emplace_back(kAlignmentKey, GgufValue::u32(static_cast<uint32_t>(alignment)));
    out.insert(out.end(), metadata.begin(), metadata.end());
    return out;
}

// Everything before the data section: header, metadata, tensor infos, padding. Validates every key,
// value, name, shape and dtype, so nothing reaches the file system before the whole input is good.
std::string make_header(const GgufMetadata& metadata, const std::vector<std::pair<std::string, Tensor>>& tensors,
                        uint64_t alignment) {
    NL_REQUIRE(std::has_single_bit(alignment) && alignment >= kMinWriteAlignment && alignment <= kMaxWriteAlignment,
               "alignment ", alignment, " is not a power of two from ", kMinWriteAlignment, " to ",
               kMaxWriteAlignment);
    NL_REQUIRE(metadata.size() <= kMaxMetadata, metadata.size(), " metadata entries exceed the limit of ",
               kMaxMetadata);
    NL_REQUIRE(tensors.size() <= kMaxTensors, tensors.size(), " tensors exceed the limit of ", kMaxTensors);

    std::string out(kMagic, 4);
    put<uint32_t>(out, 3);
    put<uint64_t>(out, tensors.size());
    put<uint64_t>(out, metadata.size());
    std::unordered_set<std::string> keys;
    for (const auto& [key, value] : metadata) {
        NL_REQUIRE(!key.empty(), "a metadata key is empty");
        NL_REQUIRE(key.size() <= kMaxKeyBytes, "metadata key '", key.substr(0, 40), "...' is ", key.size(),
                   " bytes long, more than the limit of ", kMaxKeyBytes);
        NL_REQUIRE(keys.insert(key).second, "duplicate metadata key '", key, "'");
        put_string(out, key);
        try {
            put_value(out, value);
        } catch (const Error& e) {
            throw Error(detail::concat("metadata key '", key, "': ", e.what()));
        }
    }

    std::unordered_set<std::string> names;
    uint64_t offset = 0;
    for (const auto& [name, tensor] : tensors) {
        NL_REQUIRE(!name.empty() && name.size() <= kMaxNameBytes, "tensor name '", name, "' is ", name.size(),
                   " bytes long; expected 1 to ", kMaxNameBytes, " bytes (ggml's GGML_MAX_NAME is 64 with the NUL)");
        NL_REQUIRE(names.insert(name).second, "duplicate tensor name '", name, "'");
        NL_REQUIRE(tensor.defined(), "tensor '", name, "' is undefined");
        NL_REQUIRE(tensor.dim() >= 1 && tensor.dim() <= kMaxDims, "tensor '", name, "' has shape ",
                   shape_str(tensor.shape()), "; GGUF holds 1 to ", kMaxDims, " dimensions (ggml's GGML_MAX_DIMS)");
        uint32_t ggml = 0;
        NL_REQUIRE(ggml_of_dtype(tensor.dtype(), ggml), "tensor '", name, "' is ", dtype_name(tensor.dtype()),
                   "; save_gguf writes ", kDTypesRead);
        put_string(out, name);
        put<uint32_t>(out, static_cast<uint32_t>(tensor.dim()));
        for (int64_t j = tensor.dim() - 1; j >= 0; --j) put<uint64_t>(out, static_cast<uint64_t>(tensor.size(j)));
        put<uint32_t>(out, ggml);
        put<uint64_t>(out, offset);
        offset += align_up(static_cast<uint64_t>(tensor.nbytes()), alignment);
    }
    out.append(align_up(out.size(), alignment) - out.size(), '\0');
    return out;
}

// A temp file next to the target, renamed over it on commit() and removed otherwise: a reader never
// sees half a file, and a failed save leaves nothing behind and an existing file untouched.
class AtomicFile {
public:
    explicit AtomicFile(const std::string& path) : path_(path), temp_(path + ".tmp." + std::to_string(::getpid())) {
        fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        NL_REQUIRE(fd_ >= 0, "cannot create ", temp_, ": ", errno_text());
    }
    ~AtomicFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_) ::unlink(temp_.c_str());
    }
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    // All `size` bytes; write() may write fewer than asked.
    void write(const void* data, uint64_t size) {
        const char* bytes = static_cast<const char*>(data);
        while (size > 0) {
            const ssize_t written = ::write(fd_, bytes, size);
            if (written < 0 && errno == EINTR) continue;
            NL_REQUIRE(written >= 0, "cannot write ", temp_, ": ", errno_text());
            bytes += written;
            size -= static_cast<uint64_t>(written);
        }
    }

    void zeros(uint64_t count) {
        static const char kZeros[4096] = {};
        for (uint64_t chunk; count > 0; count -= chunk) {
            chunk = std::min<uint64_t>(count, sizeof(kZeros));
            write(kZeros, chunk);
        }
    }

    void commit() {
        // fsync before rename: otherwise a crash can leave `path` renamed onto data that never hit disk.
        NL_REQUIRE(::fsync(fd_) == 0, "cannot fsync ", temp_, ": ", errno_text());
        const int fd = fd_;
        fd_ = -1;
        NL_REQUIRE(::close(fd) == 0, "cannot close ", temp_, ": ", errno_text());
        NL_REQUIRE(std::rename(temp_.c_str(), path_.c_str()) == 0, "cannot rename ", temp_, " to ", path_, ": ",
                   errno_text());
        committed_ = true;
        // Make the rename itself durable; a failure here loses nothing already written, so it is ignored.
        const std::string dir = path_.find('/') == std::string::npos ? "." : path_.substr(0, path_.rfind('/') + 1);
        const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd >= 0) {
            ::fsync(dir_fd);
            ::close(dir_fd);
        }
    }

private:
    std::string path_;
    std::string temp_;
    int fd_ = -1;
    bool committed_ = false;
};

void save(const std::string& path, const GgufMetadata& metadata,
          const std::vector<std::pair<std::string, Tensor>>& tensors, uint64_t alignment) {
    const std::string header = make_header(metadata_to_write(metadata, alignment), tensors, alignment);
    AtomicFile file(path);
    file.write(header.data(), header.size());
    for (const auto& entry : tensors) {
        // One tensor at a time on the CPU: a model on a device is never copied whole.
        const Tensor data = entry.second.to(Device::cpu()).contiguous();
        const uint64_t nbytes = static_cast<uint64_t>(data.nbytes());
        if (nbytes > 0) file.write(data.data_ptr(), nbytes);
        file.zeros(align_up(nbytes, alignment) - nbytes);
    }
    file.commit();
}

}  // namespace

const char* gguf_type_name(GgufType type) {
    switch (type) {
        case GgufType::UINT8: return "UINT8";
        case GgufType::INT8: return "INT8";
        case GgufType::UINT16: return "UINT16";
        case GgufType::INT16: return "INT16";
        case GgufType::UINT32: return "UINT32";
        case GgufType::INT32: return "INT32";
        case GgufType::FLOAT32: return "FLOAT32";
        case GgufType::BOOL: return "BOOL";
        case GgufType::STRING: return "STRING";
        case GgufType::ARRAY: return "ARRAY";
        case GgufType::UINT64: return "UINT64";
        case GgufType::INT64: return "INT64";
        case GgufType::FLOAT64: return "FLOAT64";
    }
    return "UNKNOWN";
}

std::string ggml_type_name(uint32_t type) {
    if (type < kGgmlTypeCount) return kGgmlTypes[type].name;
    return "type " + std::to_string(type);
}

// ---- GgufValue factories ----

GgufValue GgufValue::u32(uint32_t value) {
    GgufValue v;
    v.type = GgufType::UINT32;
    v.integer = value;
    return v;
}

GgufValue GgufValue::i32(int32_t value) {
    GgufValue v;
    v.type = GgufType::INT32;
    v.integer = value;
    return v;
}

GgufValue GgufValue::u64(uint64_t value) {
    NL_REQUIRE(value <= uint64_t(INT64_MAX), "GgufValue::u64: ", value,
               " is above 2^63 - 1, the most a GgufValue holds");
    GgufValue v;
    v.type = GgufType::UINT64;
    v.integer = static_cast<int64_t>(value);
    return v;
}

GgufValue GgufValue::f32(float value) {
    GgufValue v;
    v.type = GgufType::FLOAT32;
    v.real = value;
    return v;
}

GgufValue GgufValue::boolean(bool value) {
    GgufValue v;
    v.type = GgufType::BOOL;
    v.integer = value ? 1 : 0;
    return v;
}

GgufValue GgufValue::string(std::string value) {
    GgufValue v;
    v.type = GgufType::STRING;
    v.text = std::move(value);
    return v;
}

GgufValue GgufValue::string_array(std::vector<std::string> values) {
    GgufValue v;
    v.type = GgufType::ARRAY;
    v.element = GgufType::STRING;
    v.texts = std::move(values);
    return v;
}

GgufValue GgufValue::i32_array(std::vector<int64_t> values) {
    GgufValue v;
    v.type = GgufType::ARRAY;
    v.element = GgufType::INT32;
    v.integers = std::move(values);
    return v;
}

GgufValue GgufValue::f32_array(std::vector<double> values) {
    GgufValue v;
    v.type = GgufType::ARRAY;
    v.element = GgufType::FLOAT32;
    v.reals = std::move(values);
    return v;
}

// ---- GgufFile accessors ----

const GgufValue* GgufFile::find(const std::string& key) const {
    for (const auto& entry : metadata)
        if (entry.first == key) return &entry.second;
    return nullptr;
}

namespace {
const GgufValue& require_key(const GgufFile& file, const std::string& key) {
    const GgufValue* value = file.find(key);
    NL_REQUIRE(value != nullptr, file.path, ": no metadata key '", key, "'");
    return *value;
}
}  // namespace

uint64_t GgufFile::uint_at(const std::string& key) const {
    const GgufValue& value = require_key(*this, key);
    NL_REQUIRE(is_integer(value.type), path, ": metadata key '", key, "' is ", describe(value),
               ", expected an unsigned integer");
    NL_REQUIRE(value.integer >= 0, path, ": metadata key '", key, "' is ", value.integer, " (",
               gguf_type_name(value.type), "), expected a non-negative integer");
    return static_cast<uint64_t>(value.integer);
}

double GgufFile::real_at(const std::string& key) const {
    const GgufValue& value = require_key(*this, key);
    if (is_real(value.type)) return value.real;
    NL_REQUIRE(is_integer(value.type), path, ": metadata key '", key, "' is ", describe(value),
               ", expected a number (FLOAT32, FLOAT64 or an integer)");
    return static_cast<double>(value.integer);
}

const std::string& GgufFile::string_at(const std::string& key) const {
    const GgufValue& value = require_key(*this, key);
    NL_REQUIRE(value.type == GgufType::STRING, path, ": metadata key '", key, "' is ", describe(value),
               ", expected STRING");
    return value.text;
}

bool GgufFile::contains_tensor(const std::string& name) const {
    for (const auto& entry : tensors)
        if (entry.first == name) return true;
    return false;
}

const Tensor& GgufFile::tensor(const std::string& name) const {
    for (const auto& entry : tensors)
        if (entry.first == name) return entry.second;
    // Enough names to spot a naming-scheme mismatch (blk.0.* vs layers.0.*), not hundreds.
    constexpr size_t kListed = 10;
    std::string listed = tensors.empty() ? "no tensors" : "";
    for (size_t i = 0; i < tensors.size() && i < kListed; ++i) listed += (i ? ", " : "") + tensors[i].first;
    if (tensors.size() > kListed) listed += detail::concat(", ... (", tensors.size(), " in all)");
    throw Error(detail::concat(path, ": no tensor named '", name, "' (the file has ", listed, ")"));
}

// ---- load and save ----

GgufFile load_gguf(const std::string& path) {
    try {
        return load(path);
    } catch (const Error& e) {
        throw Error(detail::concat("load_gguf: ", path, ": ", e.what()));
    }
}

void save_gguf(const std::string& path, const GgufMetadata& metadata,
               const std::vector<std::pair<std::string, Tensor>>& tensors, uint64_t alignment) {
    try {
        save(path, metadata, tensors, alignment);
    } catch (const Error& e) {
        throw Error(detail::concat("save_gguf: ", path, ": ", e.what()));
    }
}

}  // namespace nl
