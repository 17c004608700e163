// libFuzzer target: load_gguf on arbitrary bytes. Any input must either load or raise nl::Error;
// anything else (a crash, a sanitizer report, another exception, a huge allocation) is a bug. The
// bytes go to an in-memory file, read back through its /proc/self/fd path.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const int fd = ::memfd_create("fuzz.gguf", 0);
    if (fd < 0 || ::ftruncate(fd, 0) != 0) return 0;
    if (size > 0 && ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
    static const std::string path = "/proc/self/fd/" + std::to_string(fd);
    try {
        const nl::GgufFile file = nl::load_gguf(path);
        // What a loaded file feeds next: every tensor's bytes (read, so ASan checks their bounds) and
        // the typed metadata reads a model loader makes.
        unsigned checksum = 0;
        for (const auto& [name, tensor] : file.tensors) {
            const auto* bytes = static_cast<const unsigned char*>(tensor.data_ptr());
            for (int64_t i = 0; i < tensor.nbytes(); ++i) checksum += bytes[i];
            checksum += file.tensor(name).dim() == tensor.dim();
        }
        for (const auto& [key, value] : file.metadata) {
            try {
                checksum += static_cast<unsigned>(file.uint_at(key));
            } catch (const nl::Error&) {
            }
            try {
                checksum += static_cast<unsigned>(file.real_at(key) != 0.0);
            } catch (const nl::Error&) {
            }
            try {
                checksum += static_cast<unsigned>(file.string_at(key).size());
            } catch (const nl::Error&) {
            }
        }
        (void)checksum;
    } catch (const nl::Error&) {
        // Refused with a message: the expected outcome for bad input.
    }
    return 0;
}
