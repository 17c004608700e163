// libFuzzer target: a checkpoint's metadata as `normlab train --resume` and `normlab sample` read it:
// the normlab.* scalars, the stored config (JSON, then the config validator) and the text vocab.
// The input is the metadata, one "key=value" per line. Any input must either be accepted or raise
// nl::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/safetensors.h"
#include "jobs/data.h"
#include "jobs/train.h"
#include "layers/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    nl::SafeTensorsFile file;
    file.path = "fuzz.safetensors";
    std::istringstream lines(std::string(reinterpret_cast<const char*>(data), size));
    std::string line;
    while (std::getline(lines, line)) {
        const size_t eq = line.find('=');
        if (eq != std::string::npos) file.metadata[line.substr(0, eq)] = line.substr(eq + 1);
    }
    try {
        const nl::CheckpointInfo info = nl::checkpoint_info(file);
        if (info.metadata.count("config")) {
            const nl::TrainConfig config =
                nl::read_train_config(nl::checkpoint_metadata_json(info, file.path, "config"), file.path);
            (void)config.resolved.dump();
        }
        if (info.metadata.count("vocab")) {
            const nl::TextVocab vocab(nl::checkpoint_metadata_json(info, file.path, "vocab"));
            std::vector<int64_t> tokens;
            for (int64_t t = 0; t < vocab.size() && t < 64; ++t) tokens.push_back(t);
            const std::string text = vocab.decode(tokens);
            if (vocab.encode(text) != tokens) __builtin_trap();  // decode then encode must round-trip
        }
    } catch (const nl::Error&) {
        // Refused with a message: the expected outcome for bad input.
    }
    return 0;
}
