// Tests for GGUF read/write: round trips of every metadata type and tensor dtype, the byte layout of
// a small file checked against bytes written by hand from ggml/docs/gguf.md, atomic saves, and every
// refusal of a corrupt or unsupported file (crafted field by field here, not by the writer).
#include <catch2/catch.hpp>

#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "test_util.h"

namespace fs = std::filesystem;
using Catch::Contains;
using nl::DType;
using nl::GgufType;
using nl::GgufValue;
using nl::Tensor;

namespace {

using nl_test::TempDir;
using Tensors = std::vector<std::pair<std::string, Tensor>>;

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string raw_bytes(const Tensor& t) {
    Tensor c = t.contiguous();
    return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.nbytes()));
}

// "47 47 55 46  // magic ..." -> bytes; whitespace and comments from "//" to the end of a line are ignored.
std::string from_hex(const std::string& hex) {
    std::string out, digits;
    bool comment = false;
    for (size_t i = 0; i < hex.size(); ++i) {
        const char c = hex[i];
        if (c == '\n') comment = false;
        else if (c == '/' && i + 1 < hex.size() && hex[i + 1] == '/') comment = true;
        else if (!comment && !std::isspace(static_cast<unsigned char>(c))) digits += c;
    }
    REQUIRE(digits.size() % 2 == 0);
    for (size_t i = 0; i < digits.size(); i += 2) out += static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16));
    return out;
}

// A GGUF file built field by field (little-endian), for crafted and corrupt inputs.
struct Gguf {
    std::string bytes;

    template <typename T>
    Gguf& put(T value) {
        bytes.append(reinterpret_cast<const char*>(&value), sizeof(T));
        return *this;
    }
    Gguf& u8(uint8_t v) { return put(v); }
    Gguf& u32(uint32_t v) { return put(v); }
    Gguf& u64(uint64_t v) { return put(v); }
    Gguf& str(const std::string& s) {
        u64(s.size());
        bytes += s;
        return *this;
    }
    Gguf& header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
        bytes += "GGUF";
        return u32(version).u64(tensors).u64(kvs);
    }
    // A key and its value type; the value follows.
    Gguf& key(const std::string& key, GgufType type) { return str(key).u32(static_cast<uint32_t>(type)); }
    // ne in file order (fastest first).
    Gguf& info(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(ne.size()));
        for (uint64_t n : ne) u64(n);
        return u32(type).u64(offset);
    }
    Gguf& pad(size_t alignment = 32) {
        bytes.append((alignment - bytes.size() % alignment) % alignment, '\0');
        return *this;
    }
    Gguf& data(size_t n) {
        bytes.append(n, '\x01');
        return *this;
    }
};

constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2;

// A tensor of `dtype` whose bytes are random (for the half types: random bit patterns, NaNs included).
Tensor random_tensor(const nl::Shape& shape, DType dtype, uint64_t seed) {
    if (dtype == DType::F32 || dtype == DType::F64) {
        nl::Generator gen(seed);
        return nl::randn(shape, gen, dtype);
    }
    Tensor t = Tensor::empty(shape, dtype);
    std::mt19937_64 rng(seed);
    auto* bytes = static_cast<unsigned char*>(t.data_ptr());
    for (int64_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
    return t;
}

GgufValue integral(GgufType type, int64_t value) {
    GgufValue v;
    v.type = type;
    v.integer = value;
    return v;
}

GgufValue real(GgufType type, double value) {
    GgufValue v;
    v.type = type;
    v.real = value;
    return v;
}

GgufValue array_of(GgufType element, std::vector<int64_t> integers, std::vector<double> reals = {}) {
    GgufValue v;
    v.type = GgufType::ARRAY;
    v.element = element;
    v.integers = std::move(integers);
    v.reals = std::move(reals);
    return v;
}

// Every field, reals bit for bit.
bool same_value(const GgufValue& a, const GgufValue& b) {
    auto same_bits = [](double x, double y) { return std::memcmp(&x, &y, sizeof(double)) == 0; };
    if (a.type != b.type || a.integer != b.integer || !same_bits(a.real, b.real) || a.text != b.text ||
        a.texts != b.texts || a.integers != b.integers || a.reals.size() != b.reals.size())
        return false;
    if (a.type == GgufType::ARRAY && a.element != b.element) return false;
    for (size_t i = 0; i < a.reals.size(); ++i)
        if (!same_bits(a.reals[i], b.reals[i])) return false;
    return true;
}

std::vector<std::string> temp_files_next_to(const std::string& path) {
    std::vector<std::string> found;
    fs::path p(path);
    const std::string prefix = p.filename().string() + ".tmp.";
    for (const auto& entry : fs::directory_iterator(p.parent_path()))
        if (entry.path().filename().string().rfind(prefix, 0) == 0) found.push_back(entry.path().string());
    return found;
}

}  // namespace

TEST_CASE("gguf: metadata of every type round-trips in order", "[gguf]") {
    TempDir tmp("gguf_meta");
    const std::string path = tmp.file("meta.gguf");
    const nl::GgufMetadata metadata = {
        {"t.uint8", integral(GgufType::UINT8, 255)},
        {"t.int8", integral(GgufType::INT8, -128)},
        {"t.uint16", integral(GgufType::UINT16, 65535)},
        {"t.int16", integral(GgufType::INT16, -32768)},
        {"t.uint32", GgufValue::u32(4294967295u)},
        {"t.int32", GgufValue::i32(std::numeric_limits<int32_t>::min())},
        {"t.float32", GgufValue::f32(0.1f)},
        {"t.float32_inf", GgufValue::f32(-std::numeric_limits<float>::infinity())},
        {"t.bool_true", GgufValue::boolean(true)},
        {"t.bool_false", GgufValue::boolean(false)},
        {"t.string", GgufValue::string(std::string("h\xc3\xa9llo\0world", 12))},
        {"t.empty_string", GgufValue::string("")},
        {"t.uint64", GgufValue::u64(uint64_t(INT64_MAX))},
        {"t.int64", integral(GgufType::INT64, INT64_MIN)},
        {"t.float64", real(GgufType::FLOAT64, 1.0 / 3.0)},
        {"a.strings", GgufValue::string_array({"<unk>", "", "\xe2\x96\x81the"})},
        {"a.int32", GgufValue::i32_array({-1, 0, std::numeric_limits<int32_t>::max()})},
        {"a.float32", GgufValue::f32_array({0.5, -2.0, 1e-3f})},
        {"a.uint8", array_of(GgufType::UINT8, {0, 7, 255})},
        {"a.int16", array_of(GgufType::INT16, {-32768, 32767})},
        {"a.uint64", array_of(GgufType::UINT64, {0, INT64_MAX})},
        {"a.int64", array_of(GgufType::INT64, {INT64_MIN, -1})},
        {"a.bool", array_of(GgufType::BOOL, {1, 0, 1})},
        {"a.float64", array_of(GgufType::FLOAT64, {}, {1e300, -0.0})},
        {"a.empty_uint16", array_of(GgufType::UINT16, {})},
        {"a.empty_strings", GgufValue::string_array({})},
    };
    nl::save_gguf(path, metadata, {});
    const nl::GgufFile file = nl::load_gguf(path);
    REQUIRE(file.path == path);
    REQUIRE(file.version == 3);
    REQUIRE(file.alignment == 32);
    REQUIRE(file.tensors.empty());
    REQUIRE(file.metadata.size() == metadata.size());
    for (size_t i = 0; i < metadata.size(); ++i) {
        INFO(metadata[i].first);
        REQUIRE(file.metadata[i].first == metadata[i].first);
        REQUIRE(same_value(file.metadata[i].second, metadata[i].second));
    }
    REQUIRE(static_cast<float>(file.find("t.float32")->real) == 0.1f);
    REQUIRE(read_bytes(path).size() % 32 == 0);
    REQUIRE(temp_files_next_to(path).empty());
}

TEST_CASE("gguf: tensors of every dtype and 1 to 4 dims round-trip bit for bit", "[gguf]") {
    TempDir tmp("gguf_tensors");
    const std::string path = tmp.file("tensors.gguf");
    nl::Generator gen(3);
    const Tensor base = nl::randn({3, 4}, gen);
    const Tensors tensors = {
        {"f32.1d", random_tensor({5}, DType::F32, 1)},
        {"f16.2d", random_tensor({2, 3}, DType::F16, 2)},
        {"bf16.3d", random_tensor({2, 3, 4}, DType::BF16, 3)},
        {"f64.4d", random_tensor({1, 2, 3, 2}, DType::F64, 4)},
        {"empty", nl::zeros({0, 3})},
        {"transposed", base.t()},  // not contiguous: saved packed
        {"blk.0.attn_q.weight", random_tensor({7, 9}, DType::F16, 5)},
    };
    REQUIRE_FALSE(base.t().is_contiguous());
    nl::save_gguf(path, {{"general.architecture", GgufValue::string("llama")}}, tensors);
    const nl::GgufFile file = nl::load_gguf(path);
    REQUIRE(file.tensors.size() == tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
        const auto& [name, original] = tensors[i];
        INFO(name);
        REQUIRE(file.tensors[i].first == name);  // the order given
        REQUIRE(file.contains_tensor(name));
        const Tensor& loaded = file.tensor(name);
        REQUIRE(loaded.dtype() == original.dtype());
        REQUIRE(loaded.shape() == original.shape());
        REQUIRE(loaded.is_contiguous());
        REQUIRE(loaded.device().is_cpu());
        REQUIRE(raw_bytes(loaded) == raw_bytes(original));
    }
    REQUIRE(file.string_at("general.architecture") == "llama");
    REQUIRE(read_bytes(path).size() % 32 == 0);  // the file ends padded to the alignment
}

TEST_CASE("gguf: the writer's bytes match the spec, written out by hand", "[gguf]") {
    TempDir tmp("gguf_layout");
    const std::string path = tmp.file("tiny.gguf");
    nl::save_gguf(path, {{"a.b", GgufValue::string("xy")}},
                  {{"w", nl::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3})},
                   {"b", nl::from_vector(std::vector<double>{1, 2, 3}, {3}, DType::F16)}});
    const std::string expected = from_hex(R"(
        47 47 55 46                                         // magic "GGUF"
        03 00 00 00                                         // version 3
        02 00 00 00 00 00 00 00                             // 2 tensors
        01 00 00 00 00 00 00 00                             // 1 metadata entry
        03 00 00 00 00 00 00 00 61 2e 62                    // key "a.b"
        08 00 00 00                                         // value type STRING
        02 00 00 00 00 00 00 00 78 79                       // "xy"
        01 00 00 00 00 00 00 00 77                          // tensor "w"
        02 00 00 00                                         // n_dims 2
        03 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00     // ne = [3, 2]: shape (2, 3) reversed
        00 00 00 00                                         // ggml type F32
        00 00 00 00 00 00 00 00                             // offset 0
        01 00 00 00 00 00 00 00 62                          // tensor "b"
        01 00 00 00                                         // n_dims 1
        03 00 00 00 00 00 00 00                             // ne = [3]
        01 00 00 00                                         // ggml type F16
        20 00 00 00 00 00 00 00                             // offset 32: the 24 bytes of "w" padded to 32
        00 00 00 00 00                                      // 123 bytes so far, padded to 128
        00 00 80 3f 00 00 00 40 00 00 40 40                 // data of w: 1, 2, 3 (f32)
        00 00 80 40 00 00 a0 40 00 00 c0 40                 // 4, 5, 6
        00 00 00 00 00 00 00 00                             // padded to 32
        00 3c 00 40 00 42                                   // data of b: 1, 2, 3 (f16)
        00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00     // padded to 32: the file ends aligned
        00 00 00 00 00 00 00 00 00 00
    )");
    REQUIRE(expected.size() == 192);
    REQUIRE(read_bytes(path) == expected);

    // A non-default alignment is written as general.alignment (UINT32), first.
    const std::string aligned = tmp.file("aligned.gguf");
    nl::save_gguf(aligned, {{"a.b", GgufValue::string("xy")}}, {{"w", nl::ones({3})}}, 64);
    const std::string bytes = read_bytes(aligned);
    REQUIRE(bytes.substr(16, 8) == from_hex("02 00 00 00 00 00 00 00"));  // 2 metadata entries
    REQUIRE(bytes.substr(24, 8 + 17 + 4 + 4) ==
            Gguf().str("general.alignment").u32(4).u32(64).bytes);
    REQUIRE(bytes.size() % 64 == 0);
    const nl::GgufFile file = nl::load_gguf(aligned);
    REQUIRE(file.alignment == 64);
    REQUIRE(file.metadata.front().first == "general.alignment");
    REQUIRE(file.uint_at("general.alignment") == 64);
    // Saving what was loaded reproduces the file: the loaded general.alignment agrees with 64.
    const std::string again = tmp.file("again.gguf");
    nl::save_gguf(again, file.metadata, file.tensors, file.alignment);
    REQUIRE(read_bytes(again) == bytes);
}

TEST_CASE("gguf: crafted files load: version 2, gaps, any order, no tensors", "[gguf]") {
    TempDir tmp("gguf_crafted");
    const std::string path = tmp.file("crafted.gguf");
    SECTION("version 2, tensors out of offset order with a gap, trailing bytes") {
        Gguf g;
        g.header(2, 1, 2).key("k", GgufType::UINT8).u8(9);
        g.info("late", {2}, kF32, 64).info("early", {1}, kF32, 0).pad();
        const float early = 1.5f;
        g.bytes.append(reinterpret_cast<const char*>(&early), 4).append(60, '\0');
        const float late[2] = {-1.0f, 2.0f};
        g.bytes.append(reinterpret_cast<const char*>(late), 8).append(5, '\x7f');
        write_bytes(path, g.bytes);
        const nl::GgufFile file = nl::load_gguf(path);
        REQUIRE(file.version == 2);
        REQUIRE(file.uint_at("k") == 9);
        REQUIRE(file.tensors[0].first == "late");
        REQUIRE(file.tensor("late").to_vector() == std::vector<double>{-1.0, 2.0});
        REQUIRE(file.tensor("early").item() == 1.5);
    }
    SECTION("no tensors and no padding after the metadata") {
        write_bytes(path, Gguf().header(0, 1).key("k", GgufType::BOOL).u8(1).bytes);
        REQUIRE(nl::load_gguf(path).find("k")->integer == 1);
    }
    SECTION("an empty tensor whose ne has a zero") {
        write_bytes(path, Gguf().header(1, 0).info("e", {4, 0}, kF32, 0).pad().bytes);
        REQUIRE(nl::load_gguf(path).tensor("e").shape() == nl::Shape{0, 4});
    }
}

TEST_CASE("gguf: typed metadata reads and tensor lookups name the file", "[gguf]") {
    TempDir tmp("gguf_access");
    const std::string path = tmp.file("access.gguf");
    nl::save_gguf(path,
                  {{"n.u32", GgufValue::u32(7)},
                   {"n.neg", GgufValue::i32(-3)},
                   {"n.f32", GgufValue::f32(1e-5f)},
                   {"n.str", GgufValue::string("llama")},
                   {"n.arr", GgufValue::i32_array({1})},
                   {"n.bool", GgufValue::boolean(true)}},
                  {{"w", nl::ones({2})}});
    const nl::GgufFile file = nl::load_gguf(path);
    REQUIRE(file.uint_at("n.u32") == 7);
    REQUIRE(file.real_at("n.f32") == double(1e-5f));
    REQUIRE(file.real_at("n.u32") == 7.0);
    REQUIRE(file.string_at("n.str") == "llama");
    REQUIRE(file.find("nope") == nullptr);
    REQUIRE_THROWS_WITH(file.uint_at("nope"), Contains(path) && Contains("no metadata key 'nope'"));
    REQUIRE_THROWS_WITH(file.uint_at("n.neg"), Contains(path) && Contains("'n.neg' is -3 (INT32)") &&
                                                   Contains("non-negative"));
    REQUIRE_THROWS_WITH(file.uint_at("n.str"), Contains("'n.str' is STRING, expected an unsigned integer"));
    REQUIRE_THROWS_WITH(file.uint_at("n.bool"), Contains("'n.bool' is BOOL"));
    REQUIRE_THROWS_WITH(file.real_at("n.arr"), Contains("'n.arr' is ARRAY of INT32, expected a number"));
    REQUIRE_THROWS_WITH(file.string_at("n.u32"), Contains(path) && Contains("'n.u32' is UINT32, expected STRING"));
    REQUIRE_FALSE(file.contains_tensor("v"));
    REQUIRE_THROWS_WITH(file.tensor("v"), Contains(path) && Contains("no tensor named 'v'") &&
                                              Contains("(the file has w)"));
}

TEST_CASE("gguf: type names follow ggml.h and the spec", "[gguf]") {
    REQUIRE(nl::ggml_type_name(0) == "F32");
    REQUIRE(nl::ggml_type_name(1) == "F16");
    REQUIRE(nl::ggml_type_name(2) == "Q4_0");
    REQUIRE(nl::ggml_type_name(8) == "Q8_0");
    REQUIRE(nl::ggml_type_name(12) == "Q4_K");
    REQUIRE(nl::ggml_type_name(23) == "IQ4_XS");
    REQUIRE(nl::ggml_type_name(27) == "I64");
    REQUIRE(nl::ggml_type_name(28) == "F64");
    REQUIRE(nl::ggml_type_name(30) == "BF16");
    REQUIRE(nl::ggml_type_name(35) == "TQ2_0");
    REQUIRE(nl::ggml_type_name(39) == "MXFP4");
    REQUIRE(nl::ggml_type_name(1000) == "type 1000");
    REQUIRE(std::string(nl::gguf_type_name(GgufType::UINT8)) == "UINT8");
    REQUIRE(std::string(nl::gguf_type_name(GgufType::ARRAY)) == "ARRAY");
    REQUIRE(std::string(nl::gguf_type_name(GgufType::FLOAT64)) == "FLOAT64");
}

TEST_CASE("gguf: every corrupt or unsupported file is a clear error naming the file", "[gguf]") {
    TempDir tmp("gguf_corrupt");
    const std::string path = tmp.file("bad.gguf");
    auto load_bytes = [&](const std::string& bytes) {
        write_bytes(path, bytes);
        return nl::load_gguf(path);
    };
    // One F32 tensor "w" of 2 elements, with `ne`, type and offset as given.
    auto one_tensor = [](const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset, size_t data) {
        return Gguf().header(1, 0).info("w", ne, type, offset).pad().data(data).bytes;
    };

    SECTION("missing file, directory") {
        REQUIRE_THROWS_WITH(nl::load_gguf(tmp.file("nope.gguf")), Contains("nope.gguf") && Contains("cannot open"));
        REQUIRE_THROWS_WITH(nl::load_gguf(tmp.path.string()), Contains("not a regular file"));
    }
    SECTION("bad magic") {
        REQUIRE_THROWS_WITH(load_bytes("GGML" + Gguf().u32(3).u64(0).u64(0).bytes),
                            Contains("load_gguf: " + path) && Contains("not a GGUF file") &&
                                Contains("expected the magic \"GGUF\"") && Contains("found 47 47 4d 4c"));
        REQUIRE_THROWS_WITH(load_bytes("GG"), Contains(path) && Contains("truncated at offset 0") &&
                                                  Contains("expected 4 bytes (the magic") && Contains("found 2"));
    }
    SECTION("versions other than 2 and 3") {
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 0, 1).bytes),
                            Contains(path) && Contains("GGUF version 1 is not supported"));
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 0, 4).bytes),
                            Contains("unsupported GGUF version 4 (expected 2 or 3)"));
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 0, 0x03000000).bytes), Contains("big-endian"));
    }
    SECTION("huge counts") {
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(uint64_t(1) << 40, 0).bytes),
                            Contains(path) && Contains("tensor count 1099511627776 exceeds the limit of 100000"));
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, UINT64_MAX).bytes),
                            Contains("metadata count 18446744073709551615 exceeds the limit of 1000000"));
        // Within the limits but more than the file holds: truncated, found before any allocation.
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 1000).bytes),
                            Contains("metadata entry 0") && Contains("truncated at offset 24"));
    }
    SECTION("huge string lengths") {
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 1).u64(uint64_t(1) << 62).bytes),
                            Contains(path) && Contains("metadata entry 0") && Contains("the key at offset 24") &&
                                Contains("4611686018427387904 bytes long, more than the limit of 65535"));
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 1).u64(100).bytes + "abc"),
                            Contains("100 bytes long, but only 3 bytes are left"));
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 1).key("k", GgufType::STRING).u64(UINT64_MAX).bytes),
                            Contains("metadata key 'k'") && Contains("more than the limit of 1048576"));
        // An array element is bounded by the file only.
        REQUIRE_THROWS_WITH(
            load_bytes(Gguf().header(0, 1).key("k", GgufType::ARRAY).u32(8).u64(1).u64(uint64_t(1) << 40).bytes),
            Contains("metadata key 'k'") && Contains("element 0 of 1") && Contains("but only 0 bytes are left"));
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(1, 0).str(std::string(64, 'n')).bytes),
                            Contains("tensor info 0") && Contains("the tensor name") &&
                                Contains("64 bytes long, more than the limit of 63"));
    }
    SECTION("huge array counts") {
        REQUIRE_THROWS_WITH(
            load_bytes(Gguf().header(0, 1).key("tokens", GgufType::ARRAY).u32(4).u64(uint64_t(1) << 61).bytes),
            Contains(path) && Contains("metadata key 'tokens'") && Contains("array of UINT32") &&
                Contains("claims 2305843009213693952 elements (at least 4 bytes each), but only 0 bytes are left"));
        REQUIRE_THROWS_WITH(
            load_bytes(Gguf().header(0, 1).key("t", GgufType::ARRAY).u32(8).u64(3).u64(0).u64(0).bytes),
            Contains("array of STRING") && Contains("claims 3 elements (at least 8 bytes each)"));
    }
    SECTION("unknown value types, arrays of arrays, bad BOOL, UINT64 above int64") {
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 1).key("k", GgufType(13)).u32(0).bytes),
                            Contains(path) && Contains("metadata key 'k'") && Contains("unknown value type 13") &&
                                Contains("expected 0 to 12"));
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 1).key("k", GgufType::ARRAY).u32(99).u64(0).bytes),
                            Contains("unknown value type 99"));
        REQUIRE_THROWS_WITH(
            load_bytes(Gguf().header(0, 1).key("k", GgufType::ARRAY).u32(9).u32(4).u64(0).u64(0).bytes),
            Contains("metadata key 'k'") && Contains("arrays of arrays are not supported"));
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 1).key("flag", GgufType::BOOL).u8(2).bytes),
                            Contains("metadata key 'flag'") && Contains("BOOL value 2") &&
                                Contains("expected 0 or 1"));
        REQUIRE_THROWS_WITH(
            load_bytes(Gguf().header(0, 1).key("flags", GgufType::ARRAY).u32(7).u64(3).u8(1).u8(0).u8(255).bytes),
            Contains("element 2 of 3") && Contains("BOOL value 255"));
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 1).key("big", GgufType::UINT64).u64(UINT64_MAX).bytes),
                            Contains("metadata key 'big'") && Contains("UINT64 value 18446744073709551615"));
    }
    SECTION("duplicate and empty keys") {
        const std::string twice =
            Gguf().header(0, 2).key("k", GgufType::UINT8).u8(1).key("k", GgufType::UINT8).u8(2).bytes;
        REQUIRE_THROWS_WITH(load_bytes(twice),
                            Contains(path) && Contains("duplicate metadata key 'k' (entries 0 and 1)"));
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 1).key("", GgufType::UINT8).u8(1).bytes),
                            Contains("metadata entry 0 has an empty key"));
    }
    SECTION("general.alignment: UINT32, a power of two") {
        for (uint32_t bad : {0u, 3u, 48u}) {
            INFO(bad);
            const std::string bytes = Gguf().header(0, 1).key("general.alignment", GgufType::UINT32).u32(bad).bytes;
            REQUIRE_THROWS_WITH(load_bytes(bytes),
                                Contains(path) && Contains("general.alignment is " + std::to_string(bad)) &&
                                    Contains("expected a power of two"));
        }
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(0, 1).key("general.alignment", GgufType::INT32).u32(32).bytes),
                            Contains("general.alignment must be UINT32, found INT32"));
        // A power of two other than 32 moves the data section and the allowed offsets.
        Gguf g;
        g.header(1, 1).key("general.alignment", GgufType::UINT32).u32(16).info("w", {2}, kF32, 0).pad(16).data(8);
        const nl::GgufFile file = load_bytes(g.bytes);
        REQUIRE(file.alignment == 16);
        REQUIRE(file.tensor("w").numel() == 2);
    }
    SECTION("duplicate tensor names") {
        Gguf g;
        g.header(2, 0).info("w", {2}, kF32, 0).info("w", {2}, kF32, 32).pad().data(40);
        REQUIRE_THROWS_WITH(load_bytes(g.bytes),
                            Contains(path) && Contains("duplicate tensor name 'w' (tensors 0 and 1)"));
    }
    SECTION("n_dims outside 1 to 4") {
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({1, 1, 1, 1, 2}, kF32, 0, 8)),
                            Contains(path) && Contains("tensor 'w' has n_dims 5; expected 1 to 4"));
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({}, kF32, 0, 8)), Contains("tensor 'w' has n_dims 0"));
    }
    SECTION("dimensions whose product overflows") {
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({uint64_t(1) << 32, uint64_t(1) << 32}, kF32, 0, 8)),
                            Contains(path) && Contains("tensor 'w' has ne [4294967296, 4294967296]") &&
                                Contains("overflows int64"));
        // An empty tensor too: its strides would overflow (ggml checks only non-empty tensors).
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({0, uint64_t(1) << 41, uint64_t(1) << 62}, kF32, 0, 8)),
                            Contains("tensor 'w' has ne [0, 2199023255552, 4611686018427387904]") &&
                                Contains("overflows int64"));
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({UINT64_MAX}, kF32, 0, 8)),
                            Contains("tensor 'w' dimension ne[0] is 18446744073709551615"));
        // The element count fits int64, the byte count (x 4) does not fit the file.
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({uint64_t(1) << 62}, kF32, 0, 8)),
                            Contains("tensor 'w'") && Contains("overflowing number of bytes"));
    }
    SECTION("quantized and other unsupported tensor types, named") {
        REQUIRE_THROWS_WITH(
            load_bytes(Gguf().header(1, 0).info("blk.0.attn_q.weight", {32}, kQ4_0, 0).pad().data(18).bytes),
            Contains(path) &&
                Contains("tensor 'blk.0.attn_q.weight' has ggml type Q4_0 (quantized); normlab reads F32, F16, BF16 "
                         "and F64"));
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({2}, 26, 0, 8)), Contains("has ggml type I32 (integer)"));
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({2}, 12, 0, 8)), Contains("has ggml type Q4_K (quantized)"));
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({2}, 1000, 0, 8)), Contains("has unknown ggml type 1000"));
    }
    SECTION("offset not a multiple of the alignment") {
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({2}, kF32, 4, 16)),
                            Contains(path) && Contains("tensor 'w' has offset 4, not a multiple of the alignment 32"));
    }
    SECTION("tensor past the end of the file") {
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({4}, kF32, 0, 8)),
                            Contains(path) && Contains("tensor 'w' (F32 [4]) at offset 0 needs 16 bytes") &&
                                Contains("past the end of the data section (8 bytes)"));
        REQUIRE_THROWS_WITH(load_bytes(one_tensor({1}, kF32, uint64_t(1) << 63, 8)),
                            Contains("at offset 9223372036854775808 needs 4 bytes, past the end"));
        // The tensor infos end before the data section's padding does.
        REQUIRE_THROWS_WITH(load_bytes(Gguf().header(1, 0).info("w", {1}, kF32, 0).bytes),
                            Contains("the data section starts at offset 64") && Contains("past the end of the file"));
    }
    SECTION("overlapping tensors") {
        Gguf g;
        g.header(3, 0).info("a", {16}, kF32, 0).info("b", {4}, kF32, 32).info("c", {0}, kF32, 32).pad().data(64);
        REQUIRE_THROWS_WITH(load_bytes(g.bytes), Contains(path) &&
                                                     Contains("tensors 'a' (bytes 0 to 64) and 'b' (bytes 32 to 48) "
                                                              "overlap"));
        Gguf same;
        same.header(2, 0).info("a", {2}, kF16, 0).info("b", {2}, kF32, 0).pad().data(8);
        REQUIRE_THROWS_WITH(load_bytes(same.bytes), Contains("overlap"));
    }
}

TEST_CASE("gguf: truncated and bit-flipped files fail cleanly", "[gguf]") {
    TempDir tmp("gguf_truncated");
    const std::string good_path = tmp.file("good.gguf");
    nl::save_gguf(good_path,
                  {{"general.name", GgufValue::string("tiny")}, {"tok", GgufValue::string_array({"a", "bc"})}},
                  {{"a", nl::ones({3, 2})}, {"b", nl::ones({2}, DType::F64)}});
    const std::string good = read_bytes(good_path);
    const std::string path = tmp.file("bad.gguf");
    auto load_prefix = [&](size_t n) {
        write_bytes(path, good.substr(0, n));
        return nl::load_gguf(path);
    };
    // Named cut points: inside the counts, a key, a value, a tensor info, the data.
    REQUIRE_THROWS_WITH(load_prefix(10), Contains(path) && Contains("truncated at offset 8") &&
                                             Contains("(the tensor count), found 2"));
    REQUIRE_THROWS_WITH(load_prefix(20), Contains("(the metadata count)"));
    REQUIRE_THROWS_WITH(load_prefix(30), Contains("metadata entry 0") && Contains("(the key)"));
    REQUIRE_THROWS_WITH(load_prefix(24 + 8 + 12 + 4 + 8 + 2),
                        Contains("metadata key 'general.name'") &&
                            Contains("a string value at offset 48 is 4 bytes long, but only 2 bytes are left"));
    REQUIRE_THROWS_WITH(load_prefix(good.size() - 33), Contains("tensor 'b'") && Contains("past the end"));
    // The data of "a" (24 bytes, padded to 32) and "b" (16 bytes, padded to 32) end the file: every
    // prefix that cuts into the header or the data is an nl::Error, never a crash or another type.
    const size_t data_end = good.size() - 16;
    for (size_t n = 0; n < data_end; ++n) {
        INFO("prefix of " << n << " bytes");
        REQUIRE_THROWS_AS(load_prefix(n), nl::Error);
    }
    REQUIRE(load_prefix(data_end).tensors.size() == 2);  // only the last tensor's padding is gone
    // Random byte corruption: loading either succeeds or throws nl::Error.
    std::mt19937 rng(321);
    for (int trial = 0; trial < 300; ++trial) {
        std::string bytes = good;
        for (int flips = 0; flips < 3; ++flips) bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
        write_bytes(path, bytes);
        try {
            (void)nl::load_gguf(path);
        } catch (const nl::Error&) {
        }
    }
}

TEST_CASE("gguf: bad inputs to save are errors and write nothing", "[gguf]") {
    TempDir tmp("gguf_badsave");
    const std::string path = tmp.file("x.gguf");
    const Tensors one = {{"w", nl::ones({2})}};
    auto save = [&](const nl::GgufMetadata& metadata, const Tensors& tensors, uint64_t alignment = 32) {
        nl::save_gguf(path, metadata, tensors, alignment);
    };
    REQUIRE_THROWS_WITH(save({}, {{"a", nl::ones({1})}, {"a", nl::ones({2})}}),
                        Contains("save_gguf: " + path) && Contains("duplicate tensor name 'a'"));
    REQUIRE_THROWS_WITH(save({}, {{"", nl::ones({1})}}), Contains("expected 1 to 63 bytes"));
    REQUIRE_THROWS_WITH(save({}, {{std::string(64, 'n'), nl::ones({1})}}),
                        Contains("is 64 bytes long; expected 1 to 63 bytes"));
    REQUIRE_NOTHROW(save({}, {{std::string(63, 'n'), nl::ones({1})}}));
    fs::remove(path);
    REQUIRE_THROWS_WITH(save({}, {{"s", nl::scalar_tensor(1.0)}}), Contains("tensor 's' has shape []") &&
                                                                      Contains("1 to 4 dimensions"));
    REQUIRE_THROWS_WITH(save({}, {{"five", nl::ones({1, 1, 1, 1, 2})}}),
                        Contains("tensor 'five' has shape [1, 1, 1, 1, 2]"));
    REQUIRE_THROWS_WITH(save({}, {{"ids", nl::from_vector(std::vector<int64_t>{1}, {1})}}),
                        Contains("tensor 'ids' is i64; save_gguf writes F32, F16, BF16 and F64"));
    REQUIRE_THROWS_WITH(save({}, {{"u", Tensor()}}), Contains("tensor 'u' is undefined"));
    REQUIRE_THROWS_WITH(save({{"k", GgufValue::u32(1)}, {"k", GgufValue::u32(2)}}, one),
                        Contains("duplicate metadata key 'k'"));
    REQUIRE_THROWS_WITH(save({{"", GgufValue::u32(1)}}, one), Contains("a metadata key is empty"));
    REQUIRE_THROWS_WITH(save({{"ids", GgufValue::i32_array({1, int64_t(1) << 31})}}, one),
                        Contains("metadata key 'ids'") && Contains("element 1 2147483648 does not fit INT32"));
    REQUIRE_THROWS_WITH(save({{"b", integral(GgufType::BOOL, 2)}}, one), Contains("value 2 does not fit BOOL"));
    REQUIRE_THROWS_WITH(save({{"u8", integral(GgufType::UINT8, -1)}}, one), Contains("value -1 does not fit UINT8"));
    REQUIRE_THROWS_WITH(save({{"x", integral(GgufType(42), 0)}}, one), Contains("unknown value type 42"));
    GgufValue nested = array_of(GgufType::ARRAY, {});
    REQUIRE_THROWS_WITH(save({{"n", nested}}, one), Contains("arrays of arrays are not supported"));
    GgufValue misfiled = array_of(GgufType::FLOAT32, {1, 2});
    REQUIRE_THROWS_WITH(save({{"m", misfiled}}, one), Contains("keeps its elements in `reals`"));
    REQUIRE_THROWS_WITH(save({{"s", GgufValue::string(std::string((1 << 20) + 1, 'x'))}}, one),
                        Contains("more than the limit of 1048576"));
    for (uint64_t bad : {0, 3, 4, 48}) {
        INFO(bad);
        REQUIRE_THROWS_WITH(save({}, one, bad),
                            Contains("alignment " + std::to_string(bad) + " is not a power of two"));
    }
    REQUIRE_THROWS_WITH(save({{"general.alignment", GgufValue::u32(32)}}, one, 64),
                        Contains("general.alignment is UINT32 32, but the alignment argument is 64"));
    REQUIRE_THROWS_WITH(GgufValue::u64(UINT64_MAX), Contains("above 2^63 - 1"));
    REQUIRE_FALSE(fs::exists(path));
    REQUIRE(temp_files_next_to(path).empty());
}

TEST_CASE("gguf: saves are atomic", "[gguf]") {
    TempDir tmp("gguf_atomic");
    const std::string path = tmp.file("model.gguf");
    nl::save_gguf(path, {}, {{"w", nl::full({4}, 1.5)}});
    std::string expected = read_bytes(path);  // what `path` holds at the end

    SECTION("a missing directory fails before anything is written") {
        const std::string missing = tmp.file("no_such_dir/model.gguf");
        REQUIRE_THROWS_WITH(nl::save_gguf(missing, {}, {{"w", nl::ones({4})}}),
                            Contains("cannot create") && Contains("no_such_dir/model.gguf"));
        REQUIRE_FALSE(fs::exists(tmp.path / "no_such_dir"));
    }
    SECTION("a failed rename removes the temp file") {
        const std::string dir_target = tmp.file("is_a_dir");
        fs::create_directories(dir_target);
        REQUIRE_THROWS_WITH(nl::save_gguf(dir_target, {}, {{"w", nl::ones({4})}}),
                            Contains("cannot rename") && Contains(dir_target));
        REQUIRE(fs::is_directory(dir_target));
        REQUIRE(temp_files_next_to(dir_target).empty());
    }
    SECTION("an invalid save leaves the existing file untouched") {
        REQUIRE_THROWS_WITH(nl::save_gguf(path, {}, {{"w", nl::ones({8})}, {"w", nl::ones({8})}}),
                            Contains(path) && Contains("duplicate tensor name 'w'"));
    }
    SECTION("a successful save replaces the file") {
        nl::save_gguf(path, {}, {{"w", nl::full({2}, -2.0)}});
        REQUIRE(nl::load_gguf(path).tensor("w").to_vector() == std::vector<double>{-2.0, -2.0});
        expected = read_bytes(path);
    }
    REQUIRE(read_bytes(path) == expected);
    REQUIRE(temp_files_next_to(path).empty());
}

TEST_CASE("gguf: the fuzzing seeds are valid files", "[gguf]") {
    const fs::path dir = fs::path(NORMLAB_SOURCE_DIR) / "tests/fuzz/corpus/gguf";
    REQUIRE(fs::is_directory(dir));
    int count = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
        INFO(entry.path().string());
        (void)nl::load_gguf(entry.path().string());
        ++count;
    }
    REQUIRE(count >= 2);
}
