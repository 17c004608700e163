// Tests for safetensors read/write: round trips per dtype, layout conventions shared with PyTorch's
// writer, atomic saves, every corrupt-file error, and files written by Python (tests/reference).
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using Catch::Contains;
using nl::DType;
using nl::Tensor;

namespace {

using nl_test::TempDir;

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(uint64_t value) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
    return out;
}

// A crafted file: length prefix + header text as given + data bytes.
std::string craft(const std::string& header, const std::string& data) {
    return u64_le(header.size()) + header + data;
}

std::string raw_bytes(const Tensor& t) {
    Tensor c = t.contiguous();
    return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.nbytes()));
}

// A tensor of `dtype` whose bytes are random (for half types: random bit patterns, NaNs included).
Tensor random_tensor(const nl::Shape& shape, DType dtype, uint64_t seed) {
    Tensor t = Tensor::empty(shape, dtype);
    std::mt19937_64 rng(seed);
    auto* bytes = static_cast<unsigned char*>(t.data_ptr());
    for (int64_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(rng());
    if (dtype == DType::F32 || dtype == DType::F64) {  // keep float values finite and readable
        nl::Generator gen(seed);
        t = nl::randn(shape, gen, dtype);
    }
    return t;
}

std::vector<std::string> temp_files_next_to(const std::string& path) {
    std::vector<std::string> found;
    fs::path p(path);
    std::string prefix = p.filename().string() + ".tmp.";
    for (const auto& entry : fs::directory_iterator(p.parent_path()))
        if (entry.path().filename().string().rfind(prefix, 0) == 0) found.push_back(entry.path().string());
    return found;
}

}  // namespace

TEST_CASE("safetensors: round trip keeps every dtype bit exact", "[safetensors]") {
    TempDir tmp("st_roundtrip");
    std::string path = tmp.file("all.safetensors");
    std::vector<std::pair<std::string, Tensor>> tensors = {
        {"w.f32", random_tensor({3, 5}, DType::F32, 1)},
        {"w.f64", random_tensor({2, 3, 4}, DType::F64, 2)},
        {"w.bf16", random_tensor({7}, DType::BF16, 3)},
        {"w.f16", random_tensor({4, 3}, DType::F16, 4)},
        {"ids", nl::from_vector(std::vector<int64_t>{-1, 0, int64_t(1) << 40, INT64_MAX, INT64_MIN}, {5})},
    };
    nl::save_safetensors(path, tensors);
    nl::SafeTensorsFile file = nl::load_safetensors(path);
    REQUIRE(file.tensors.size() == tensors.size());
    REQUIRE(file.metadata.empty());
    REQUIRE(file.path == path);
    for (const auto& [name, original] : tensors) {
        INFO(name);
        REQUIRE(file.contains(name));
        const Tensor& loaded = file.at(name);
        REQUIRE(loaded.dtype() == original.dtype());
        REQUIRE(loaded.shape() == original.shape());
        REQUIRE(loaded.is_contiguous());
        REQUIRE(loaded.device().is_cpu());
        REQUIRE(raw_bytes(loaded) == raw_bytes(original));
    }
    REQUIRE(temp_files_next_to(path).empty());
}

TEST_CASE("safetensors: 0-d, empty and non-contiguous tensors", "[safetensors]") {
    TempDir tmp("st_shapes");
    std::string path = tmp.file("shapes.safetensors");
    nl::Generator gen(7);
    Tensor base = nl::randn({3, 4}, gen);
    Tensor transposed = base.t();                       // (4, 3), strides (1, 4)
    Tensor strided = base.slice(1, 0, 4, 2);            // (3, 2), every other column
    Tensor expanded = nl::randn({1, 3}, gen, DType::F64).expand({4, 3});  // stride 0
    REQUIRE_FALSE(transposed.is_contiguous());
    nl::save_safetensors(path, {{"scalar", nl::scalar_tensor(3.25)},
                                {"empty", nl::zeros({0, 3})},
                                {"empty_f64", nl::zeros({2, 0}, DType::F64)},
                                {"transposed", transposed},
                                {"strided", strided},
                                {"expanded", expanded}});
    nl::SafeTensorsFile file = nl::load_safetensors(path);
    REQUIRE(file.at("scalar").shape() == nl::Shape{});
    REQUIRE(file.at("scalar").item() == 3.25);
    REQUIRE(file.at("empty").shape() == nl::Shape{0, 3});
    REQUIRE(file.at("empty_f64").shape() == nl::Shape{2, 0});
    REQUIRE(file.at("empty_f64").dtype() == DType::F64);
    REQUIRE(file.at("transposed").shape() == nl::Shape{4, 3});
    REQUIRE(file.at("transposed").to_vector() == transposed.to_vector());
    REQUIRE(file.at("strided").to_vector() == strided.to_vector());
    REQUIRE(file.at("expanded").shape() == nl::Shape{4, 3});
    REQUIRE(file.at("expanded").to_vector() == expanded.to_vector());
}

TEST_CASE("safetensors: layout follows the reference writer", "[safetensors]") {
    TempDir tmp("st_layout");
    std::string path = tmp.file("order.safetensors");
    nl::save_safetensors(path,
                         {{"z", nl::ones({2}, DType::F32)},
                          {"a", nl::ones({3}, DType::F16)},
                          {"m", nl::ones({1}, DType::F64)},
                          {"c", nl::ones({1}, DType::BF16)},
                          {"b", nl::from_vector(std::vector<int64_t>{5}, {1})},
                          {"y", nl::ones({1}, DType::F32)}},
                         {{"format", "pt"}, {"note", "x"}});
    // Largest alignment first (I64, F64, F32, BF16, F16), then by name.
    nl::SafeTensorsFile file = nl::load_safetensors(path);
    REQUIRE(file.names() == std::vector<std::string>{"b", "m", "y", "z", "c", "a"});
    std::string bytes = read_bytes(path);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
    REQUIRE(n % 8 == 0);
    std::string header = bytes.substr(8, n);
    REQUIRE(header.rfind("{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},\"b\":{\"dtype\":\"I64\","
                         "\"shape\":[1],\"data_offsets\":[0,8]}",
                         0) == 0);
    REQUIRE(bytes.size() == 8 + n + 8 + 8 + 4 * 3 + 2 + 3 * 2);
}

TEST_CASE("safetensors: metadata round trip and lookup errors", "[safetensors]") {
    TempDir tmp("st_meta");
    std::string path = tmp.file("meta.safetensors");
    std::map<std::string, std::string> metadata = {
        {"format", "pt"}, {"torch_version", "2.5.0"}, {"quote", "a \"b\"\n\\c"}, {"utf8", "\xc3\xa9t\xc3\xa9"}};
    nl::save_safetensors(path, {{"x", nl::ones({2, 2})}}, metadata);
    nl::SafeTensorsFile file = nl::load_safetensors(path);
    REQUIRE(file.metadata == metadata);
    REQUIRE_THROWS_WITH(file.at("y"), Contains(path) && Contains("no tensor named 'y'") && Contains("x"));

    // Empty file set: a header of just "{}" padded.
    std::string empty_path = tmp.file("none.safetensors");
    nl::save_safetensors(empty_path, {});
    REQUIRE(read_bytes(empty_path) == u64_le(8) + "{}      ");
    REQUIRE(nl::load_safetensors(empty_path).tensors.empty());
}

TEST_CASE("safetensors: bad inputs to save are errors", "[safetensors]") {
    TempDir tmp("st_badsave");
    std::string path = tmp.file("x.safetensors");
    REQUIRE_THROWS_WITH(nl::save_safetensors(path, {{"a", nl::ones({1})}, {"a", nl::ones({2})}}),
                        Contains("duplicate tensor name 'a'"));
    REQUIRE_THROWS_WITH(nl::save_safetensors(path, {{"__metadata__", nl::ones({1})}}), Contains("reserved"));
    REQUIRE_THROWS_WITH(nl::save_safetensors(path, {{"u", Tensor()}}), Contains("'u' is undefined"));
    REQUIRE_THROWS_WITH(nl::save_safetensors(path, {{"bad\xff", nl::ones({1})}}), Contains("UTF-8"));
    REQUIRE_FALSE(fs::exists(path));
    REQUIRE(temp_files_next_to(path).empty());
}

TEST_CASE("safetensors: saves are atomic", "[safetensors]") {
    TempDir tmp("st_atomic");
    std::string path = tmp.file("model.safetensors");
    nl::save_safetensors(path, {{"w", nl::full({4}, 1.5)}});
    const std::string before = read_bytes(path);

    SECTION("a missing directory fails before anything is written") {
        std::string missing = tmp.file("no_such_dir/model.safetensors");
        REQUIRE_THROWS_WITH(nl::save_safetensors(missing, {{"w", nl::ones({4})}}),
                            Contains("cannot create") && Contains("no_such_dir/model.safetensors"));
        REQUIRE_FALSE(fs::exists(tmp.path / "no_such_dir"));
        REQUIRE(read_bytes(path) == before);
    }
    SECTION("a failed rename removes the temp file") {
        // The target is a directory: the temp file is fully written, then rename() fails.
        std::string dir_target = tmp.file("is_a_dir");
        fs::create_directories(dir_target);
        REQUIRE_THROWS_WITH(nl::save_safetensors(dir_target, {{"w", nl::ones({4})}}),
                            Contains("cannot rename") && Contains(dir_target));
        REQUIRE(fs::is_directory(dir_target));
        REQUIRE(temp_files_next_to(dir_target).empty());
        REQUIRE(read_bytes(path) == before);
    }
    SECTION("an invalid save leaves the existing file untouched") {
        REQUIRE_THROWS_WITH(nl::save_safetensors(path, {{"w", nl::ones({8})}, {"w", nl::ones({8})}}),
                            Contains(path) && Contains("duplicate tensor name 'w'"));
        REQUIRE(read_bytes(path) == before);
    }
    SECTION("a successful save replaces the file and leaves no temp") {
        nl::save_safetensors(path, {{"w", nl::full({2}, -2.0)}});
        REQUIRE(nl::load_safetensors(path).at("w").to_vector() == std::vector<double>{-2.0, -2.0});
    }
    REQUIRE(temp_files_next_to(path).empty());
}

TEST_CASE("safetensors: every corrupt file is a clear error naming the file", "[safetensors]") {
    TempDir tmp("st_corrupt");
    std::string path = tmp.file("bad.safetensors");
    auto load_bytes = [&](const std::string& bytes) {
        write_bytes(path, bytes);
        return nl::load_safetensors(path);
    };
    auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                    const std::string& offsets) {
        return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets +
               "}";
    };
    const std::string f32x2(8, '\x01');  // 2 floats worth of bytes

    SECTION("missing file") {
        REQUIRE_THROWS_WITH(nl::load_safetensors(tmp.file("nope.safetensors")),
                            Contains("nope.safetensors") && Contains("cannot open"));
    }
    SECTION("directory instead of file") {
        REQUIRE_THROWS_WITH(nl::load_safetensors(tmp.path.string()), Contains("not a regular file"));
    }
    SECTION("shorter than 8 bytes") {
        REQUIRE_THROWS_WITH(load_bytes("abc"), Contains(path) && Contains("expected at least 8 bytes") &&
                                                   Contains("found 3"));
        REQUIRE_THROWS_WITH(load_bytes(""), Contains(path) && Contains("found 0"));
    }
    SECTION("header length larger than the file") {
        REQUIRE_THROWS_WITH(load_bytes(u64_le(64) + "{}"),
                            Contains(path) && Contains("header length 64") && Contains("rest of the file (2 bytes)"));
    }
    SECTION("header length above 100 MB") {
        REQUIRE_THROWS_WITH(load_bytes(u64_le(uint64_t(1) << 62) + "{}"),
                            Contains(path) && Contains("exceeds the limit of 100000000"));
        REQUIRE_THROWS_WITH(load_bytes(u64_le(UINT64_MAX) + "{}"), Contains(path) && Contains("exceeds the limit"));
    }
    SECTION("header not valid JSON") {
        REQUIRE_THROWS_WITH(load_bytes(craft("{\"a\": [1, 2", "")), Contains(path) && Contains("not valid JSON"));
        REQUIRE_THROWS_WITH(load_bytes(craft("{} x", "")), Contains(path) && Contains("not valid JSON"));
    }
    SECTION("header not an object") {
        REQUIRE_THROWS_WITH(load_bytes(craft("[1, 2]  ", "")),
                            Contains(path) && Contains("expected the header to be a JSON object, found array"));
    }
    SECTION("entry not an object or missing a field") {
        REQUIRE_THROWS_WITH(load_bytes(craft("{\"a\":3}", "")), Contains(path) && Contains("tensor 'a'") &&
                                                                    Contains("found number"));
        REQUIRE_THROWS_WITH(load_bytes(craft("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", f32x2)),
                            Contains(path) && Contains("tensor 'a'") && Contains("missing \"dtype\""));
        REQUIRE_THROWS_WITH(load_bytes(craft("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", f32x2)),
                            Contains(path) && Contains("missing \"shape\""));
        REQUIRE_THROWS_WITH(load_bytes(craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", f32x2)),
                            Contains(path) && Contains("missing \"data_offsets\""));
    }
    SECTION("unknown dtype") {
        REQUIRE_THROWS_WITH(load_bytes(craft("{" + entry("a", "F8_E4M3", "[8]", "[0,8]") + "}", f32x2)),
                            Contains(path) && Contains("unsupported dtype \"F8_E4M3\"") && Contains("F32, F64"));
    }
    SECTION("negative or non-integer shape") {
        REQUIRE_THROWS_WITH(load_bytes(craft("{" + entry("a", "F32", "[-2]", "[0,8]") + "}", f32x2)),
                            Contains(path) && Contains("non-negative integers, found [-2]"));
        REQUIRE_THROWS_WITH(load_bytes(craft("{" + entry("a", "F32", "[2.0]", "[0,8]") + "}", f32x2)),
                            Contains(path) && Contains("non-negative integers, found [2.0]"));
        REQUIRE_THROWS_WITH(load_bytes(craft("{" + entry("a", "F32", "2", "[0,8]") + "}", f32x2)),
                            Contains(path) && Contains("shape to be an array"));
    }
    SECTION("bad data_offsets") {
        REQUIRE_THROWS_WITH(load_bytes(craft("{" + entry("a", "F32", "[2]", "[0]") + "}", f32x2)),
                            Contains(path) && Contains("expected data_offsets to be [begin, end]"));
        REQUIRE_THROWS_WITH(load_bytes(craft("{" + entry("a", "F32", "[2]", "[-8,0]") + "}", f32x2)),
                            Contains(path) && Contains("expected data_offsets to be [begin, end]"));
        REQUIRE_THROWS_WITH(load_bytes(craft("{" + entry("a", "F32", "[2]", "[8,0]") + "}", f32x2)),
                            Contains(path) && Contains("out of order: begin 8 > end 0"));
    }
    SECTION("overlapping offsets") {
        std::string header = "{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}";
        REQUIRE_THROWS_WITH(load_bytes(craft(header, std::string(12, '\0'))),
                            Contains(path) && Contains("tensor 'b'") && Contains("overlap"));
    }
    SECTION("a gap between tensors") {
        std::string header = "{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}";
        REQUIRE_THROWS_WITH(load_bytes(craft(header, std::string(12, '\0'))),
                            Contains(path) && Contains("tensor 'b'") && Contains("gap: expected begin 4"));
    }
    SECTION("offsets beyond the data section (truncated file)") {
        REQUIRE_THROWS_WITH(load_bytes(craft("{" + entry("a", "F32", "[4]", "[0,16]") + "}", f32x2)),
                            Contains(path) && Contains("beyond the data section (8 bytes)"));
    }
    SECTION("byte count differs from numel * dtype size") {
        REQUIRE_THROWS_WITH(load_bytes(craft("{" + entry("a", "F32", "[3]", "[0,8]") + "}", f32x2)),
                            Contains(path) && Contains("shape [3] of F32 needs 12 bytes") && Contains("hold 8"));
        REQUIRE_THROWS_WITH(
            load_bytes(craft("{" + entry("a", "F64", "[4294967296,4294967296,16]", "[0,8]") + "}", f32x2)),
            Contains(path) && Contains("overflowing"));
    }
    SECTION("duplicate names") {
        std::string header = "{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("a", "F32", "[1]", "[4,8]") + "}";
        REQUIRE_THROWS_WITH(load_bytes(craft(header, f32x2)),
                            Contains(path) && Contains("duplicate tensor name 'a'"));
    }
    SECTION("trailing garbage") {
        REQUIRE_THROWS_WITH(load_bytes(craft("{" + entry("a", "F32", "[1]", "[0,4]") + "}", f32x2)),
                            Contains(path) && Contains("trailing garbage") && Contains("cover 4 bytes") &&
                                Contains("holds 8 bytes"));
    }
    SECTION("bad metadata") {
        REQUIRE_THROWS_WITH(load_bytes(craft("{\"__metadata__\":{\"k\":1}}", "")),
                            Contains(path) && Contains("__metadata__['k'] to be a string"));
        REQUIRE_THROWS_WITH(load_bytes(craft("{\"__metadata__\":[]}", "")),
                            Contains(path) && Contains("__metadata__ to be an object"));
    }
    SECTION("a valid crafted file loads (the crafting itself is right)") {
        std::string header = "{" + entry("b", "F32", "[1]", "[4,8]") + "," + entry("a", "F32", "[1]", "[0,4]") + "}";
        std::string data;
        float values[2] = {1.5f, -2.0f};
        data.append(reinterpret_cast<const char*>(values), 8);
        nl::SafeTensorsFile file = load_bytes(craft(header, data));
        REQUIRE(file.names() == std::vector<std::string>{"a", "b"});  // file order, not header order
        REQUIRE(file.at("a").item() == 1.5);
        REQUIRE(file.at("b").item() == -2.0);
    }
}

TEST_CASE("safetensors: a file written by Python's safetensors loads, and we write it byte for byte",
          "[safetensors]") {
    const std::string path = std::string(NORMLAB_SOURCE_DIR) + "/tests/reference/python_sample.safetensors";
    nl::SafeTensorsFile file = nl::load_safetensors(path);
    // Values chosen by make_fixtures.py (write_python_sample) to be exact in their dtypes.
    REQUIRE(file.metadata.at("format") == "pt");
    REQUIRE(file.at("f32").dtype() == DType::F32);
    REQUIRE(file.at("f32").shape() == nl::Shape{2, 3});
    REQUIRE(file.at("f32").to_vector() == std::vector<double>{-1.0, -0.5, 0.0, 0.5, 1.0, 1.5});
    REQUIRE(file.at("f64").dtype() == DType::F64);
    REQUIRE(file.at("f64").to_vector() == std::vector<double>{1.0 / 3.0, -2.5e-300, 1e300});
    REQUIRE(file.at("bf16").dtype() == DType::BF16);
    REQUIRE(file.at("bf16").to_vector() == std::vector<double>{1.0, -2.5, 3.140625, -0.0});
    REQUIRE(file.at("f16").dtype() == DType::F16);
    REQUIRE(file.at("f16").to_vector() == std::vector<double>{0.5, -65504.0, 0.00006103515625,
                                                                 0.000000059604644775390625});
    REQUIRE(file.at("i64").dtype() == DType::I64);
    REQUIRE(file.at("i64").to_vector_as<int64_t>() ==
            std::vector<int64_t>{-1, 0, int64_t(1) << 40, INT64_MAX});
    REQUIRE(file.at("scalar").shape() == nl::Shape{});
    REQUIRE(file.at("scalar").item() == 7.25);
    REQUIRE(file.at("empty").shape() == nl::Shape{0, 3});

    // Saving what we loaded must reproduce Python's bytes exactly (same order, header and padding).
    TempDir tmp("st_python");
    std::string ours = tmp.file("ours.safetensors");
    nl::save_safetensors(ours, file.tensors, file.metadata);
    REQUIRE(read_bytes(ours) == read_bytes(path));
}

TEST_CASE("safetensors: every PyTorch fixture loads and re-saves byte for byte", "[safetensors]") {
    const fs::path dir = fs::path(NORMLAB_SOURCE_DIR) / "tests/reference/fixtures";
    REQUIRE(fs::is_directory(dir));
    TempDir tmp("st_fixtures");
    int count = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
        if (entry.path().extension() != ".safetensors") continue;
        INFO(entry.path().string());
        nl::SafeTensorsFile file = nl::load_safetensors(entry.path().string());
        REQUIRE_FALSE(file.tensors.empty());
        REQUIRE(file.metadata.count("torch_version") == 1);
        // make_fixtures.py sorts the metadata keys, so our writer must reproduce the file exactly.
        std::string copy = tmp.file("copy.safetensors");
        nl::save_safetensors(copy, file.tensors, file.metadata);
        REQUIRE(read_bytes(copy) == read_bytes(entry.path().string()));
        ++count;
    }
    REQUIRE(count >= 19);  // the files make_fixtures.py writes today

    auto load = [&](const std::string& name) { return nl::load_safetensors((dir / name).string()); };
    nl::SafeTensorsFile linear = load("linear.safetensors");
    REQUIRE(linear.at("weight").shape() == nl::Shape{4, 5});
    REQUIRE(linear.at("bias").shape() == nl::Shape{4});
    REQUIRE(linear.at("grad.weight").shape() == nl::Shape{4, 5});
    REQUIRE(linear.at("input").shape() == nl::Shape{2, 3, 5});
    REQUIRE(linear.at("grad_input").shape() == nl::Shape{2, 3, 5});
    REQUIRE(linear.at("output").shape() == nl::Shape{2, 3, 4});

    nl::SafeTensorsFile swiglu = load("swiglu.safetensors");
    REQUIRE(swiglu.at("w1.weight").shape() == nl::Shape{48, 16});
    REQUIRE(swiglu.at("w2.weight").shape() == nl::Shape{16, 48});

    nl::SafeTensorsFile attention = load("attention.safetensors");
    REQUIRE(attention.at("wk.weight").shape() == nl::Shape{8, 16});  // n_kv_heads 2 * head_dim 4
    REQUIRE(attention.at("rope.cos").shape() == nl::Shape{5, 2});

    nl::SafeTensorsFile block = load("llama_block.safetensors");
    REQUIRE(block.at("attention.wq.weight").shape() == nl::Shape{16, 16});
    REQUIRE(block.at("feed_forward.w1.weight").shape() == nl::Shape{48, 16});
    REQUIRE(block.at("grad.attention_norm.weight").shape() == nl::Shape{16});

    REQUIRE(load("rmsnorm_bf16.safetensors").at("output").dtype() == DType::BF16);
    nl::SafeTensorsFile ce = load("cross_entropy.safetensors");
    REQUIRE(ce.at("target").dtype() == DType::I64);
    REQUIRE(ce.at("target").at({1}) == -100);
    REQUIRE(ce.at("output").shape() == nl::Shape{});

    nl::SafeTensorsFile adam = load("adamw_mlp.safetensors");
    REQUIRE(adam.at("losses").shape() == nl::Shape{10});
    REQUIRE(adam.at("final.fc1.weight").shape() == nl::Shape{16, 8});
    REQUIRE(adam.metadata.at("weight_decay") == "0.1");

    nl::SafeTensorsFile data = load("stability_data.safetensors");
    REQUIRE(data.at("x").shape() == nl::Shape{1000, 100});
    REQUIRE(data.at("y").shape() == nl::Shape{1000, 10});
    for (const char* norm : {"rmsnorm", "layernorm"}) {
        INFO(norm);
        nl::SafeTensorsFile init = load(std::string("stability_init_") + norm + ".safetensors");
        REQUIRE(init.at("fc1.weight").shape() == nl::Shape{256, 100});
        REQUIRE(init.at("fc2.weight").shape() == nl::Shape{256, 256});
        REQUIRE(init.at("fc3.weight").shape() == nl::Shape{10, 256});
        REQUIRE(init.at("norm2.weight").shape() == nl::Shape{256});
        REQUIRE(init.contains("norm1.bias") == (std::string(norm) == "layernorm"));
        for (const char* dtype : {"f32", "f64"}) {
            INFO(dtype);
            nl::SafeTensorsFile run = load(std::string("stability_") + norm + "_" + dtype + ".safetensors");
            DType expected = std::string(dtype) == "f64" ? DType::F64 : DType::F32;
            REQUIRE(run.at("losses").shape() == nl::Shape{100});
            REQUIRE(run.at("losses").dtype() == expected);
            REQUIRE(run.at("losses_perturbed").shape() == nl::Shape{100});
        }
    }
}

TEST_CASE("safetensors: truncated and bit-flipped files fail cleanly", "[safetensors]") {
    TempDir tmp("st_fuzz");
    std::string good_path = tmp.file("good.safetensors");
    nl::save_safetensors(good_path, {{"a", nl::ones({3, 2})}, {"b", nl::ones({2}, DType::F64)}}, {{"k", "v"}});
    const std::string good = read_bytes(good_path);
    std::string path = tmp.file("bad.safetensors");

    // Every proper prefix is an nl::Error (never a crash or another exception type).
    for (size_t n = 0; n < good.size(); ++n) {
        INFO("prefix of " << n << " bytes");
        write_bytes(path, good.substr(0, n));
        REQUIRE_THROWS_AS(nl::load_safetensors(path), nl::Error);
    }
    // Random byte corruption: loading either succeeds or throws nl::Error.
    std::mt19937 rng(123);
    int errors = 0;
    for (int trial = 0; trial < 500; ++trial) {
        std::string bytes = good;
        int flips = 1 + static_cast<int>(rng() % 3);
        for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
        write_bytes(path, bytes);
        try {
            nl::load_safetensors(path);
        } catch (const nl::Error&) {
            ++errors;
        }
    }
    REQUIRE(errors > 0);
}

TEST_CASE("safetensors: a memory-mapped file gives the loaded file's tensors, copy-on-write, outliving the file object", "[safetensors]") {
    TempDir tmp("st_map");
    const std::string path = tmp.file("m.safetensors");
    std::vector<std::pair<std::string, Tensor>> tensors = {{"a", random_tensor({3, 5}, DType::F32, 1)},
                                                           {"b", random_tensor({7}, DType::BF16, 2)},
                                                           {"c", random_tensor({2, 2}, DType::F64, 3)},
                                                           {"d", random_tensor({0, 4}, DType::F16, 4)},
                                                           {"e", random_tensor({5}, DType::I64, 5)}};
    nl::save_safetensors(path, tensors, {{"k", "v"}});
    const std::string bytes = read_bytes(path);
    Tensor kept;
    {
        const nl::SafeTensorsFile loaded = nl::load_safetensors(path);
        const nl::SafeTensorsFile mapped = nl::map_safetensors(path);
        REQUIRE(mapped.names() == loaded.names());
        CHECK(mapped.metadata == loaded.metadata);
        for (const auto& [name, tensor] : loaded.tensors) {
            INFO(name);
            CHECK(mapped.at(name).shape() == tensor.shape());
            CHECK(mapped.at(name).dtype() == tensor.dtype());
            CHECK(raw_bytes(mapped.at(name)) == raw_bytes(tensor));
        }
        kept = mapped.at("a");
    }
    // The map outlives the SafeTensorsFile; a write stays in this process (MAP_PRIVATE).
    const std::string a_bytes = raw_bytes(kept);
    kept.fill_(2.0);
    CHECK(nl::sum(kept.to(DType::F64)).item() == 30.0);
    CHECK(read_bytes(path) == bytes);
    CHECK(raw_bytes(nl::load_safetensors(path).at("a")) == a_bytes);
}

TEST_CASE("safetensors: a mapped tensor at an offset that is not a multiple of its element size is copied out", "[safetensors]") {
    TempDir tmp("st_map_unaligned");
    const std::string path = tmp.file("u.safetensors");
    // "h" (BF16, 2 bytes) first, so "f" (F32) starts 2 bytes into the data section, which itself
    // starts at byte 8 + 48 (a multiple of 8): f sits at an offset that is not a multiple of 4.
    std::string header = "{\"h\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[0,2]},"
                         "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[2,10]}}";
    header.append((8 - header.size() % 8) % 8, ' ');
    const float values[2] = {1.5f, -2.25f};
    std::string data = std::string("\x80\x3f", 2) + std::string(reinterpret_cast<const char*>(values), 8);
    write_bytes(path, craft(header, data));
    const nl::SafeTensorsFile mapped = nl::map_safetensors(path);
    CHECK(nl::sum(mapped.at("f").to(DType::F64)).item() == -0.75);
    CHECK(nl::sum(mapped.at("h").to(DType::F64)).item() == 1.0);
    CHECK(raw_bytes(mapped.at("f")) == raw_bytes(nl::load_safetensors(path).at("f")));
}

TEST_CASE("safetensors: mapping checks the file as loading does", "[safetensors]") {
    TempDir tmp("st_map_bad");
    const std::string path = tmp.file("bad.safetensors");
    write_bytes(path, craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", std::string(8, '\x01')));
    std::string loading, mapping;
    try {
        nl::load_safetensors(path);
    } catch (const nl::Error& e) {
        loading = e.what();
    }
    try {
        nl::map_safetensors(path);
    } catch (const nl::Error& e) {
        mapping = e.what();
    }
    CHECK_THAT(loading, Contains(path) && Contains("beyond the data section (8 bytes)"));
    CHECK(mapping == loading);
    REQUIRE_THROWS_WITH(nl::map_safetensors(tmp.file("nope.safetensors")), Contains("nope.safetensors") && Contains("cannot open"));
}
