// safetensors read/write: header layout and ordering follow the reference implementation
// (huggingface/safetensors, safetensors/src/tensor.rs: prepare(), read_metadata(), validate()).
#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/json_parse.h"
#include "core/shape.h"

namespace nl {

// The data section is copied byte for byte into tensors, which is only right on a little-endian host.
static_assert(std::endian::native == std::endian::little, "safetensors: a little-endian host is assumed");

namespace {

// The writer keeps the reference's key order (ordered_json); the reader parses into a sorted map
// (json): ordered_json inserts by linear search, quadratic in the number of tensors.
using ordered_json = nlohmann::ordered_json;
using json = nlohmann::json;

// The reference reader refuses headers above 100 MB: a header length is the first thing an attacker
// (or a truncated download) controls, so it is bounded before anything is allocated.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// At most this many tensors in one file: large language models hold a few thousand; the 100 MB
// header alone would admit ~1.6 million empty entries.
constexpr size_t kMaxTensors = 100'000;

// The reference writer's ordering rank: its Dtype enum is "in increasing alignment order" and
// prepare() sorts by that enum descending, so I64 > F64 > F32 > BF16 > F16.
int dtype_rank(DType dtype) {
    switch (dtype) {
        case DType::F16: return 0;
        case DType::BF16: return 1;
        case DType::F32: return 2;
        case DType::F64: return 3;
        case DType::I64: return 4;
    }
    NL_CHECK(false, "unknown dtype");
    return -1;
}

bool dtype_from_safetensors_name(const std::string& name, DType& out) {
    for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64}) {
        if (name == safetensors_dtype_name(dtype)) {
            out = dtype;
            return true;
        }
    }
    return false;
}

std::string errno_text() { return std::strerror(errno); }

// Writes all `size` bytes or throws; write() may write less than asked.
void write_all(int fd, const void* data, size_t size, const std::string& temp_path) {
    const char* bytes = static_cast<const char*>(data);
    while (size > 0) {
        ssize_t written = ::write(fd, bytes, size);
        if (written < 0) {
            if (errno == EINTR) continue;
            throw Error(detail::concat("save_safetensors: cannot write ", temp_path, ": ", errno_text()));
        }
        bytes += written;
        size -= static_cast<size_t>(written);
    }
}

// Removes the temp file unless dismissed: every failure path after the file exists cleans up.
struct TempFileGuard {
    std::string path;
    int fd = -1;
    bool keep = false;
    ~TempFileGuard() {
        if (fd >= 0) ::close(fd);
        if (!keep) ::unlink(path.c_str());
    }
};

// The header as the reference writer makes it: compact JSON, "__metadata__" first (when given),
// then the tensors in storage order, each {"dtype", "shape", "data_offsets"}, padded to 8 bytes.
std::string make_header(const std::vector<std::pair<std::string, Tensor>>& sorted,
                        const std::map<std::string, std::string>& metadata) {
    ordered_json header = ordered_json::object();
    if (!metadata.empty()) {
        ordered_json meta = ordered_json::object();
        for (const auto& [key, value] : metadata) meta[key] = value;
        header["__metadata__"] = meta;
    }
    int64_t offset = 0;
    for (const auto& [name, tensor] : sorted) {
        ordered_json entry = ordered_json::object();
        entry["dtype"] = safetensors_dtype_name(tensor.dtype());
        entry["shape"] = tensor.shape();
        entry["data_offsets"] = {offset, offset + tensor.nbytes()};
        offset += tensor.nbytes();
        header[name] = entry;
    }
    std::string text;
    try {
        text = header.dump();
    } catch (const nlohmann::json::exception& e) {
        // dump() refuses invalid UTF-8 in names or metadata.
        throw Error(detail::concat("save_safetensors: a tensor name or metadata entry is not valid UTF-8 (",
                                   e.what(), ")"));
    }
    // Padding keeps the data section 8-byte aligned for readers that map the file.
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
}

// nlohmann's plain DOM parser (linear time) with the top-level keys watched: duplicate tensor names,
// which the DOM would keep silently (the last one wins), and their number, bounded while parsing.
// (nlohmann's callback parser would do the watching, but it rescans the parent object after every
// value: quadratic in the number of tensors, minutes for 100,000 entries.)
class HeaderSax {
public:
    HeaderSax(json& result, const std::string& path) : dom_(result, true), path_(path) {}

    bool null() { return dom_.null(); }
    bool boolean(bool value) { return dom_.boolean(value); }
    bool number_integer(json::number_integer_t value) { return dom_.number_integer(value); }
    bool number_unsigned(json::number_unsigned_t value) { return dom_.number_unsigned(value); }
    bool number_float(json::number_float_t value, const std::string& text) { return dom_.number_float(value, text); }
    bool string(std::string& value) { return dom_.string(value); }
    bool binary(json::binary_t& value) { return dom_.binary(value); }
    bool start_object(std::size_t size) { return ++depth_, dom_.start_object(size); }
    bool end_object() { return --depth_, dom_.end_object(); }
    bool start_array(std::size_t size) { return ++depth_, dom_.start_array(size); }
    bool end_array() { return --depth_, dom_.end_array(); }
    bool key(std::string& name) {
        if (depth_ == 1) {
            if (!keys_.insert(name).second && duplicate_.empty()) duplicate_ = name;
            const size_t tensors = keys_.size() - keys_.count("__metadata__");
            NL_REQUIRE(tensors <= kMaxTensors, "load_safetensors: ", path_, ": header has more than ", kMaxTensors,
                       " tensors (the limit)");
        }
        return dom_.key(name);
    }
    template <typename Exception>
    bool parse_error(std::size_t position, const std::string& token, const Exception& error) {
        return dom_.parse_error(position, token, error);  // throws it
    }

    const std::string& duplicate() const { return duplicate_; }

private:
    nlohmann::detail::json_sax_dom_parser<json> dom_;
    const std::string& path_;
    int depth_ = 0;  // 1 inside the top-level object
    std::set<std::string> keys_;
    std::string duplicate_;
};

struct EntryInfo {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin;
    uint64_t end;
};

// Validates one header entry; `where` is "<file>: tensor '<name>'" for messages.
EntryInfo parse_entry(const std::string& where, const std::string& name, const json& entry) {
    NL_REQUIRE(entry.is_object(), where, ": expected an object with dtype, shape and data_offsets, found ",
               entry.type_name());
    for (const char* key : {"dtype", "shape", "data_offsets"})
        NL_REQUIRE(entry.contains(key), where, ": missing \"", key, "\"");

    EntryInfo info;
    info.name = name;
    const json& dtype = entry["dtype"];
    NL_REQUIRE(dtype.is_string(), where, ": expected dtype to be a string, found ", brief_json(dtype));
    NL_REQUIRE(dtype_from_safetensors_name(dtype.get<std::string>(), info.dtype), where,
               ": unsupported dtype ", brief_json(dtype), " (expected one of F32, F64, BF16, F16, I64)");

    const json& shape = entry["shape"];
    NL_REQUIRE(shape.is_array(), where, ": expected shape to be an array, found ", brief_json(shape));
    for (const json& size : shape) {
        // is_number_integer excludes floats; unsigned covers sizes above int64 which we then refuse.
        NL_REQUIRE(size.is_number_integer() && !(size.is_number_unsigned() &&
                                                 size.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())),
                   where, ": expected shape to hold non-negative integers, found ", brief_json(shape));
        int64_t value = size.get<int64_t>();
        NL_REQUIRE(value >= 0, where, ": expected shape to hold non-negative integers, found ", brief_json(shape));
        info.shape.push_back(value);
    }

    const json& offsets = entry["data_offsets"];
    bool two_unsigned = offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                        offsets[1].is_number_unsigned();
    NL_REQUIRE(two_unsigned, where, ": expected data_offsets to be [begin, end] with non-negative integers, found ",
               brief_json(offsets));
    info.begin = offsets[0].get<uint64_t>();
    info.end = offsets[1].get<uint64_t>();
    NL_REQUIRE(info.begin <= info.end, where, ": data_offsets out of order: begin ", info.begin, " > end ",
               info.end);
    return info;
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
    switch (dtype) {
        case DType::F32: return "F32";
        case DType::F64: return "F64";
        case DType::BF16: return "BF16";
        case DType::F16: return "F16";
        case DType::I64: return "I64";
    }
    NL_CHECK(false, "unknown dtype");
    return "";
}

bool SafeTensorsFile::contains(const std::string& name) const {
    for (const auto& entry : tensors)
        if (entry.first == name) return true;
    return false;
}

const Tensor& SafeTensorsFile::at(const std::string& name) const {
    for (const auto& entry : tensors)
        if (entry.first == name) return entry.second;
    // A checkpoint can hold hundreds of names: list enough to spot a prefix mismatch, not all.
    constexpr size_t kListed = 20;
    std::string present;
    for (size_t i = 0; i < tensors.size() && i < kListed; ++i) present += (i ? ", " : "") + tensors[i].first;
    if (tensors.size() > kListed) present += ", ... and " + std::to_string(tensors.size() - kListed) + " more";
    throw Error(detail::concat(path, ": no tensor named '", name, "' (the file has: ",
                               present.empty() ? "no tensors" : present, ")"));
}

std::vector<std::string> SafeTensorsFile::names() const {
    std::vector<std::string> out;
    for (const auto& entry : tensors) out.push_back(entry.first);
    return out;
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
    // Validate and pack everything before touching the file system.
    std::vector<std::pair<std::string, Tensor>> sorted;
    std::set<std::string> seen;
    for (const auto& [name, tensor] : tensors) {
        NL_REQUIRE(tensor.defined(), "save_safetensors: ", path, ": tensor '", name, "' is undefined");
        NL_REQUIRE(name != "__metadata__", "save_safetensors: ", path,
                   ": '__metadata__' is reserved and cannot name a tensor");
        NL_REQUIRE(seen.insert(name).second, "save_safetensors: ", path, ": duplicate tensor name '", name, "'");
        sorted.emplace_back(name, tensor.to(Device::cpu()).contiguous());
    }
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
        int ra = dtype_rank(a.second.dtype()), rb = dtype_rank(b.second.dtype());
        if (ra != rb) return ra > rb;
        return a.first < b.first;
    });
    std::string header = make_header(sorted, metadata);

    TempFileGuard temp;
    temp.path = path + ".tmp." + std::to_string(::getpid());
    temp.fd = ::open(temp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (temp.fd < 0) {
        int err = errno;
        temp.keep = true;  // nothing was created (or it is not ours to remove)
        throw Error(detail::concat("save_safetensors: cannot create ", temp.path, " (to write ", path,
                                   "): ", std::strerror(err)));
    }
    uint64_t header_size = header.size();
    unsigned char size_bytes[8];
    for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<unsigned char>(header_size >> (8 * i));
    write_all(temp.fd, size_bytes, 8, temp.path);
    write_all(temp.fd, header.data(), header.size(), temp.path);
    for (const auto& entry : sorted)
        if (entry.second.nbytes() > 0)
            write_all(temp.fd, entry.second.data_ptr(), static_cast<size_t>(entry.second.nbytes()), temp.path);
    // fsync before rename: otherwise a crash can leave `path` renamed onto a file whose data never hit disk.
    if (::fsync(temp.fd) != 0)
        throw Error(detail::concat("save_safetensors: cannot fsync ", temp.path, ": ", errno_text()));
    int fd = temp.fd;
    temp.fd = -1;
    if (::close(fd) != 0)
        throw Error(detail::concat("save_safetensors: cannot close ", temp.path, ": ", errno_text()));
    if (std::rename(temp.path.c_str(), path.c_str()) != 0)
        throw Error(detail::concat("save_safetensors: cannot rename ", temp.path, " to ", path, ": ",
                                   errno_text()));
    temp.keep = true;
    // Make the rename itself durable; a failure here loses nothing already written, so it is ignored.
    std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
    int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd >= 0) {
        ::fsync(dir_fd);
        ::close(dir_fd);
    }
}

namespace {

// The header's length: the file's first 8 bytes, little-endian, bounded by the limit and by the
// rest of the file.
uint64_t read_header_length(std::ifstream& in, const std::string& path, uint64_t file_size) {
    NL_REQUIRE(file_size >= 8, "load_safetensors: ", path, ": file too short: expected at least 8 bytes ",
               "(the header length), found ", file_size);
    unsigned char size_bytes[8];
    in.read(reinterpret_cast<char*>(size_bytes), 8);
    NL_REQUIRE(in.good(), "load_safetensors: ", path, ": cannot read the header length");
    uint64_t header_size = 0;
    for (int i = 0; i < 8; ++i) header_size |= uint64_t(size_bytes[i]) << (8 * i);
    NL_REQUIRE(header_size <= kMaxHeaderBytes, "load_safetensors: ", path, ": header length ", header_size,
               " bytes exceeds the limit of ", kMaxHeaderBytes, " bytes");
    NL_REQUIRE(header_size <= file_size - 8, "load_safetensors: ", path, ": header length ", header_size,
               " bytes is larger than the rest of the file (", file_size - 8, " bytes): truncated or corrupt");
    return header_size;
}

// The header's JSON text, header_size bytes, parsed into a JSON object with unique top-level keys.
json read_header(std::ifstream& in, const std::string& path, uint64_t header_size) {
    std::string header_text(header_size, '\0');
    in.read(header_text.data(), static_cast<std::streamsize>(header_size));
    NL_REQUIRE(in.good(), "load_safetensors: ", path, ": cannot read the ", header_size, "-byte header");

    // The format pads the header with spaces only. nlohmann's parser stops at a NUL byte as if the
    // text ended there, so NUL padding (or anything hidden after a NUL) would pass unseen.
    const size_t nul = header_text.find('\0');
    NL_REQUIRE(nul == std::string::npos, "load_safetensors: ", path, ": header holds a NUL byte at offset ", nul,
               " (the header is JSON padded with spaces only)");
    // Parsing, copying and printing JSON recurse per nesting level: deep input is refused first.
    check_json_depth(header_text, "load_safetensors: " + path + ": header");

    json header;
    HeaderSax sax(header, path);
    try {
        json::sax_parse(header_text, &sax);
    } catch (const nlohmann::json::exception& e) {
        throw Error(detail::concat("load_safetensors: ", path, ": header is not valid JSON (", e.what(), ")"));
    }
    NL_REQUIRE(header.is_object(), "load_safetensors: ", path, ": expected the header to be a JSON object, found ",
               header.type_name());
    NL_REQUIRE(sax.duplicate().empty(), "load_safetensors: ", path, ": duplicate tensor name '", sax.duplicate(),
               "' in the header");
    return header;
}

// The header's entries: "__metadata__" (an object of strings) into metadata, every other key a
// tensor's entry, validated, in the header's (sorted) key order.
std::vector<EntryInfo> parse_header_entries(const std::string& path, const json& header,
                                            std::map<std::string, std::string>& metadata) {
    std::vector<EntryInfo> entries;
    for (const auto& [key, value] : header.items()) {
        if (key == "__metadata__") {
            NL_REQUIRE(value.is_object(), "load_safetensors: ", path,
                       ": expected __metadata__ to be an object of strings, found ", value.type_name());
            for (const auto& [meta_key, meta_value] : value.items()) {
                NL_REQUIRE(meta_value.is_string(), "load_safetensors: ", path, ": expected __metadata__['",
                           meta_key, "'] to be a string, found ", brief_json(meta_value));
                metadata[meta_key] = meta_value.get<std::string>();
            }
            continue;
        }
        entries.push_back(parse_entry(detail::concat("load_safetensors: ", path, ": tensor '", key, "'"), key, value));
    }
    return entries;
}

// Sorts the entries by offset and checks that they tile the data section exactly: each starts
// where the previous ended, the first at 0 and the last at the end of the file (as the reference
// validates), and each holds exactly its shape's bytes.
void check_data_layout(const std::string& path, std::vector<EntryInfo>& entries, uint64_t data_size) {
    std::sort(entries.begin(), entries.end(), [](const EntryInfo& a, const EntryInfo& b) {
        if (a.begin != b.begin) return a.begin < b.begin;
        if (a.end != b.end) return a.end < b.end;
        return a.name < b.name;
    });
    uint64_t expected_begin = 0;
    for (const EntryInfo& info : entries) {
        std::string where = detail::concat("load_safetensors: ", path, ": tensor '", info.name, "'");
        NL_REQUIRE(info.begin >= expected_begin, where, ": data_offsets [", info.begin, ", ", info.end,
                   "] overlap the previous tensor, which ends at ", expected_begin);
        NL_REQUIRE(info.begin == expected_begin, where, ": data_offsets [", info.begin, ", ", info.end,
                   "] leave a gap: expected begin ", expected_begin);
        NL_REQUIRE(info.end <= data_size, where, ": data_offsets [", info.begin, ", ", info.end,
                   "] go beyond the data section (", data_size, " bytes)");
        int64_t numel = 0;
        bool fits = checked_shape_numel(info.shape, numel) &&
                    uint64_t(numel) <= std::numeric_limits<uint64_t>::max() / dtype_size(info.dtype);
        uint64_t expected_bytes = fits ? uint64_t(numel) * dtype_size(info.dtype) : 0;
        NL_REQUIRE(fits && expected_bytes == info.end - info.begin, where, ": shape ", shape_str(info.shape),
                   " of ", safetensors_dtype_name(info.dtype), " needs ",
                   fits ? std::to_string(expected_bytes) : std::string("an overflowing number of"),
                   " bytes, but data_offsets [", info.begin, ", ", info.end, "] hold ", info.end - info.begin);
        expected_begin = info.end;
    }
    NL_REQUIRE(expected_begin == data_size, "load_safetensors: ", path, ": trailing garbage: the tensors cover ",
               expected_begin, " bytes of the data section, but it holds ", data_size, " bytes");
}

// The tensors' data, read in file order (the entries sorted by offset, the stream at the data section).
// Every size is bounded by the file size (check_data_layout), so the allocations are safe.
void read_tensors(std::ifstream& in, const std::string& path, const std::vector<EntryInfo>& entries,
                  std::vector<std::pair<std::string, Tensor>>& tensors) {
    for (const EntryInfo& info : entries) {
        Tensor tensor;
        try {
            tensor = Tensor::empty(info.shape, info.dtype);
        } catch (const Error& e) {  // e.g. an empty tensor whose strides overflow: [0, 2^32, 2^32]
            throw Error(detail::concat("load_safetensors: ", path, ": tensor '", info.name, "': ", e.what()));
        }
        const uint64_t nbytes = info.end - info.begin;
        if (nbytes > 0) {
            in.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(nbytes));
            NL_REQUIRE(in.good(), "load_safetensors: ", path, ": cannot read ", nbytes, " bytes of tensor '",
                       info.name, "'");
        }
        tensors.emplace_back(info.name, std::move(tensor));
    }
}

// A file opened and its header read and checked against its size (both readers start here); `in`
// is left at the data section.
struct CheckedHeader {
    uint64_t file_size = 0;
    uint64_t data_start = 0;         // 8 + the header's length
    std::vector<EntryInfo> entries;  // sorted by offset (check_data_layout)
};

CheckedHeader read_checked_header(const std::string& path, std::ifstream& in, SafeTensorsFile& file) {
    struct stat st {};
    NL_REQUIRE(::stat(path.c_str(), &st) == 0, "load_safetensors: cannot open ", path, ": ", errno_text());
    NL_REQUIRE(S_ISREG(st.st_mode), "load_safetensors: ", path, " is not a regular file");
    in.open(path, std::ios::binary);
    NL_REQUIRE(in.good(), "load_safetensors: cannot open ", path, ": ", errno_text());
    CheckedHeader out;
    out.file_size = static_cast<uint64_t>(st.st_size);
    const uint64_t header_size = read_header_length(in, path, out.file_size);
    const json header = read_header(in, path, header_size);
    file.path = path;
    out.entries = parse_header_entries(path, header, file.metadata);
    out.data_start = 8 + header_size;
    check_data_layout(path, out.entries, out.file_size - out.data_start);
    return out;
}

}  // namespace

SafeTensorsFile load_safetensors(const std::string& path) {
    SafeTensorsFile file;
    std::ifstream in;
    const CheckedHeader checked = read_checked_header(path, in, file);
    read_tensors(in, path, checked.entries, file.tensors);
    return file;
}

SafeTensorsFile map_safetensors(const std::string& path) {
    SafeTensorsFile file;
    const CheckedHeader checked = [&] {
        std::ifstream in;
        return read_checked_header(path, in, file);
    }();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    NL_REQUIRE(fd >= 0, "load_safetensors: cannot open ", path, ": ", errno_text());
    void* map = ::mmap(nullptr, checked.file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    const std::string map_error = map == MAP_FAILED ? errno_text() : std::string();
    ::close(fd);  // the map keeps the file
    NL_REQUIRE(map != MAP_FAILED, "load_safetensors: cannot map ", path, ": ", map_error);
    const size_t mapped = static_cast<size_t>(checked.file_size);
    auto storage = std::make_shared<Storage>(map, mapped, Device::cpu(), [map, mapped] { ::munmap(map, mapped); });
    for (const EntryInfo& info : checked.entries) {
        const uint64_t byte_offset = checked.data_start + info.begin;
        const uint64_t element = dtype_size(info.dtype);
        if (byte_offset % element != 0) {  // Tensor offsets count elements: copy this one out
            Tensor tensor = Tensor::empty(info.shape, info.dtype);
            std::memcpy(tensor.data_ptr(), static_cast<const char*>(map) + byte_offset, info.end - info.begin);
            file.tensors.emplace_back(info.name, std::move(tensor));
            continue;
        }
        file.tensors.emplace_back(info.name, Tensor(storage, info.shape, contiguous_strides(info.shape),
                                                    static_cast<int64_t>(byte_offset / element), info.dtype));
    }
    return file;
}

}  // namespace nl
