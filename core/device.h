// Where a tensor lives: the CPU or CUDA device N.
#pragma once

#include <string>

namespace nl {

struct Device {
    enum class Type { CPU, CUDA };
    Type type = Type::CPU;
    int index = 0;

    static Device cpu() { return Device{Type::CPU, 0}; }
    static Device cuda(int index = 0) { return Device{Type::CUDA, index}; }
    bool is_cpu() const { return type == Type::CPU; }
    bool is_cuda() const { return type == Type::CUDA; }
    std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
    bool operator==(const Device& other) const { return type == other.type && index == other.index; }
    bool operator!=(const Device& other) const { return !(*this == other); }
};

// Parses "cpu", "cuda", "cuda:1"; throws nl::Error naming the accepted forms otherwise.
Device device_from_name(const std::string& name);

}  // namespace nl
