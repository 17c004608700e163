// libFuzzer target: the `normlab train` config reader and validator on arbitrary text, as a config
// file or (input starting "set:") as one `--set` override line followed by the config. Any input
// must either validate or raise nl::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/json_parse.h"
#include "jobs/config.h"
#include "jobs/train.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string text(reinterpret_cast<const char*>(data), size);
    std::string assignment;
    if (text.rfind("set:", 0) == 0) {
        const size_t end = text.find('\n');
        assignment = text.substr(4, end == std::string::npos ? std::string::npos : end - 4);
        text = end == std::string::npos ? std::string("{}") : text.substr(end + 1);
    }
    try {
        nl::json root = nl::parse_json(text, "fuzz.json");
        if (!assignment.empty()) nl::apply_override(root, assignment);
        const nl::TrainConfig config = nl::read_train_config(root, "fuzz.json");
        // What run_train does next with a valid config, short of allocating: the memory estimate.
        (void)nl::estimated_train_bytes(config, nl::SyntheticTask::vocab_size_of(config.data));
        (void)config.resolved.dump();
    } catch (const nl::Error&) {
        // Refused with a message: the expected outcome for bad input.
    }
    return 0;
}
