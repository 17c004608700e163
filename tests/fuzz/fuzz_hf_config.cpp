// libFuzzer target: a transformers config.json as read by import (nl::read_hf_config, after the
// bounded JSON parser). Any input must end in a value or an nl::Error: never a crash, a sanitizer
// report, another exception or a huge allocation. Seeds: tests/fuzz/corpus/hf_config/.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "core/json_parse.h"
#include "jobs/interop.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        const nlohmann::json config = nl::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "config.json");
        const nl::HfConfig c = nl::read_hf_config(config, "config.json");
        // What was accepted is a model normlab can build the options of, and write back.
        c.options.validate();
        (void)nl::hf_config_json(c.options, nl::DType::F32).dump();
    } catch (const nl::Error&) {
    }
    return 0;
}
