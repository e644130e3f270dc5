// ferry_test_peer: the far side of the multi-process tests. It starts an engine, registers a
// host buffer filled with a pattern, prints its descriptors and answers commands on stdin:
//   ENGINE <hex of packed EngineDesc>
//   MEMORY <hex of packed MemoryDesc>
//   READY
// Commands: "hash OFFSET SIZE" -> "HASH <fnv1a64>", "notes" -> "NOTES <count> <last message>",
// "fill SEED" -> "OK" (refills the buffer), "exit".
// Usage: ferry_test_peer BYTES [--rma auto|always|never] [--listen HOST] [--workers N]
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "base/tsan.h"
#include "ferry/engine.h"

namespace {

std::string Hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

uint64_t Fnv(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void Fill(std::vector<uint8_t>& buf, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < buf.size(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    buf[i] = static_cast<uint8_t>(x);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ferry_test_peer BYTES [--rma auto|always|never] [--listen HOST] [--workers N]\n");
    return 2;
  }
  ferry::EngineOptions options;
  options.transports = {"ucx"};
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rma") {
      options.ucx.rma = value == "always" ? ferry::UcxOptions::Rma::kAlways
                        : value == "never" ? ferry::UcxOptions::Rma::kNever
                                           : ferry::UcxOptions::Rma::kAuto;
    } else if (flag == "--listen") {
      options.ucx.listen_host = value;
    } else if (flag == "--workers") {
      options.ucx.workers = std::stoi(value);
    }
  }
  auto engine = ferry::Engine::Create(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> buf(std::stoull(argv[1]));
  Fill(buf, 1);
  auto desc = (*engine)->RegisterMemory(buf.data(), buf.size());
  if (!desc.ok()) {
    std::fprintf(stderr, "register: %s\n", desc.status().ToString().c_str());
    return 1;
  }
  std::cout << "ENGINE " << Hex((*engine)->Describe().Pack()) << "\n"
            << "MEMORY " << Hex(desc->Pack()) << "\nREADY" << std::endl;
  size_t notes = 0;
  std::string last;
  std::string cmd;
  while (std::cin >> cmd) {
    FERRY_TSAN_WIRE_ACQUIRE();  // commands follow transfers that landed through UCX
    if (cmd == "hash") {
      uint64_t off = 0, size = 0;
      std::cin >> off >> size;
      if (off > buf.size() || size > buf.size() - off) {
        std::cout << "ERR range" << std::endl;
        continue;
      }
      std::cout << "HASH " << Fnv(buf.data() + off, size) << std::endl;
    } else if (cmd == "notes") {
      for (auto& n : (*engine)->PopNotifications()) {
        ++notes;
        last = n.message;
      }
      std::cout << "NOTES " << notes << " " << (last.empty() ? "-" : last) << std::endl;
    } else if (cmd == "fill") {
      uint64_t seed = 0;
      std::cin >> seed;
      Fill(buf, seed);
      std::cout << "OK" << std::endl;
    } else if (cmd == "exit") {
      break;
    }
  }
  return 0;
}
