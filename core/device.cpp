// Parsing device names: "cpu", "cuda", "cuda:N".
#include "core/device.h"

#include "core/error.h"

namespace nl {

Device device_from_name(const std::string& name) {
    if (name == "cpu") return Device::cpu();
    if (name == "cuda") return Device::cuda(0);
    if (name.rfind("cuda:", 0) == 0 && name.size() > 5) {
        std::string digits = name.substr(5);
        bool all_digits = digits.size() <= 6;
        for (char c : digits) all_digits = all_digits && c >= '0' && c <= '9';
        if (all_digits) return Device::cuda(std::stoi(digits));
    }
    throw Error("device: expected \"cpu\", \"cuda\" or \"cuda:N\", found \"" + name + "\"");
}

}  // namespace nl
