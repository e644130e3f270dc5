// ferry_test_peer: the far side of the multi-process tests. It starts an engine, registers a
// host buffer filled with a pattern, prints its descriptors and answers commands on stdin:
//   ENGINE <hex of packed EngineDesc>
//   MEMORY <hex of packed MemoryDesc>
//   READY
// Commands: "hash OFFSET SIZE" -> "HASH <fnv1a64>", "notes" -> "NOTES <count> <last message>",
// "fill SEED" -> "OK" (refills the buffer), "dereg" -> "DEREG <code>" (deregisters it),
// "stats" -> "STATS <rejected messages> <dropped notifications>", "exit".
// As an initiator: "peer HEX" (packed EngineDesc) -> "OK" | "ERR <code>", "open HEX" (packed
// MemoryDesc) -> "SESSION <transport>" | "ERR <code>", "write|read LOCAL REMOTE SIZE" on that
// session -> "DONE <code>", "writes COUNT SIZE" (COUNT writes of SIZE at offset 0) ->
// "DONE <code of the first failure, or OK>", "notify COUNT SIZE" (COUNT notifications to the
// last peer added, the i-th "n<i>" padded with '.' to SIZE bytes) -> "NOTIFIED <count taken>
// <code of the first failure, or OK>" (it stops at the first failure).
// With --kind cuda the buffer is GPU memory of --device (default 0), registered as such.
// Usage: ferry_test_peer BYTES [--key KEY] [--rma auto|always|never] [--listen HOST] [--kind host|cuda]
//                              [--device N] [--transports a,b,...] (default ucx)
//                              [--alloc heap|shared|vmm] (default heap; vmm: GPU memory mapped from
//                              3 cuMem allocations) [--fill SEED] [--workers N]
//                              [--progress event|poll|shared] (UcxOptions::progress)
// (--fill 0: the buffer starts zeroed, quick for benchmarks of many GiB; default seed 1)
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "base/tsan.h"
#include "cuda/runtime.h"
#include "ferry/engine.h"
#include "ferry/shared_memory.h"

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

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// The registered buffer: on the heap or shareable (ferry::AllocateSharedHost).
struct Buf {
  std::vector<uint8_t> heap;
  ferry::HostBuffer shared;
  uint8_t* data() { return shared ? reinterpret_cast<uint8_t*>(shared.data()) : heap.data(); }
  size_t size() const { return shared ? shared.size() : heap.size(); }
  uint8_t& operator[](size_t i) { return data()[i]; }
};

void Fill(Buf& buf, uint64_t seed) {
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
    std::fprintf(stderr, "usage: ferry_test_peer BYTES [--rma auto|always|never] [--key KEY] [--listen HOST] [--workers N]\n");
    return 2;
  }
  ferry::EngineOptions options;
  bool gpu = false;
  int device = 0;
  uint64_t fill_seed = 1;
  bool shared = false;
  bool vmm = false;  // --kind cuda: GPU memory of 3 VMM allocations (as PyTorch's expandable segments)
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rma") {
      options.ucx.rma = value == "always" ? ferry::UcxOptions::Rma::kAlways
                        : value == "never" ? ferry::UcxOptions::Rma::kNever
                                           : ferry::UcxOptions::Rma::kAuto;
    } else if (flag == "--key") {
      options.key = value;
    } else if (flag == "--listen") {
      options.ucx.listen_host = value;
    } else if (flag == "--kind") {
      gpu = value == "cuda";
    } else if (flag == "--fill") {
      fill_seed = std::stoull(value);
    } else if (flag == "--device") {
      device = std::stoi(value);
    } else if (flag == "--transports") {
      options.transports.clear();
      for (size_t at = 0; at <= value.size();) {
        size_t comma = std::min(value.find(',', at), value.size());
        options.transports.push_back(value.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (flag == "--alloc") {
      shared = value == "shared";
      vmm = value == "vmm";
    } else if (flag == "--workers") {
      options.ucx.workers = std::stoi(value);
    } else if (flag == "--progress") {
      options.ucx.progress = value == "poll"     ? ferry::UcxOptions::Progress::kPolling
                             : value == "shared" ? ferry::UcxOptions::Progress::kShared
                                                 : ferry::UcxOptions::Progress::kEvent;
    }
  }
  if (options.transports.empty()) options.transports = {"ucx"};
  auto engine = ferry::Engine::Create(options);
  if (!engine.ok()) {
    std::fprintf(stderr, "engine: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  Buf buf;
  if (shared) {
    auto b = ferry::AllocateSharedHost(std::stoull(argv[1]));
    if (!b.ok()) {
      std::fprintf(stderr, "alloc: %s\n", b.status().ToString().c_str());
      return 1;
    }
    buf.shared = std::move(b).value();
  } else {
    buf.heap.resize(std::stoull(argv[1]));
  }
  if (fill_seed != 0) Fill(buf, fill_seed);
  // GPU mode: `buf` mirrors the device buffer; commands upload and download it whole.
  void* dev = nullptr;
  if (gpu) {
    auto p = vmm ? ferry::cuda::VmmAlloc(device, buf.size(), 3) : ferry::cuda::Malloc(device, buf.size());
    if (!p.ok() || !(fill_seed != 0 ? ferry::cuda::CopySync(*p, buf.data(), buf.size())
                                    : ferry::cuda::MemsetSync(*p, 0, buf.size()))
                        .ok()) {
      std::fprintf(stderr, "cuda: %s\n", p.ok() ? "upload failed" : p.status().ToString().c_str());
      return 1;
    }
    dev = *p;
  }
  auto sync_down = [&] { return !gpu || ferry::cuda::CopySync(buf.data(), dev, buf.size()).ok(); };
  auto desc = gpu ? (*engine)->RegisterMemory(dev, buf.size(), ferry::MemoryKind::kCuda, device)
                  : (*engine)->RegisterMemory(buf.data(), buf.size());
  if (!desc.ok()) {
    std::fprintf(stderr, "register: %s\n", desc.status().ToString().c_str());
    return 1;
  }
  std::cout << "ENGINE " << Hex((*engine)->Describe().Pack()) << "\n"
            << "MEMORY " << Hex(desc->Pack()) << "\nREADY" << std::endl;
  size_t notes = 0;
  std::string last;
  std::string cmd;
  ferry::Session session;
  std::string peer_key;  // of the last "peer"
  auto code = [](const ferry::Status& s) { return std::string(ferry::CodeName(s.code())); };
  while (std::cin >> cmd) {
    FERRY_TSAN_WIRE_ACQUIRE();  // commands follow transfers that landed through UCX
    if (cmd == "hash") {
      uint64_t off = 0, size = 0;
      std::cin >> off >> size;
      if (off > buf.size() || size > buf.size() - off) {
        std::cout << "ERR range" << std::endl;
        continue;
      }
      if (!sync_down()) {
        std::cout << "ERR download" << std::endl;
        continue;
      }
      std::cout << "HASH " << Fnv(buf.data() + off, size) << std::endl;
    } else if (cmd == "notes") {
      for (auto& n : (*engine)->PopNotifications()) {
        ++notes;
        last = n.message;
      }
      std::cout << "NOTES " << notes << " " << (last.empty() ? "-" : last) << std::endl;
    } else if (cmd == "stats") {
      ferry::EngineStats st = (*engine)->stats();
      std::cout << "STATS " << st.rejected_messages << " " << st.dropped_notifications << std::endl;
    } else if (cmd == "fill") {
      uint64_t seed = 0;
      std::cin >> seed;
      Fill(buf, seed);
      if (gpu && !ferry::cuda::CopySync(dev, buf.data(), buf.size()).ok()) {
        std::cout << "ERR upload" << std::endl;
        continue;
      }
      std::cout << "OK" << std::endl;
    } else if (cmd == "dereg") {
      ferry::Status s = (*engine)->DeregisterMemory(desc->region);
      std::cout << "DEREG " << ferry::CodeName(s.code()) << std::endl;
    } else if (cmd == "peer") {
      std::string hex;
      std::cin >> hex;
      auto d = ferry::EngineDesc::Unpack(Unhex(hex));
      ferry::Status s = d.ok() ? (*engine)->AddPeer(*d) : d.status();
      if (s.ok()) peer_key = d->key;
      std::cout << (s.ok() ? "OK" : "ERR " + code(s)) << std::endl;
    } else if (cmd == "open") {
      std::string hex;
      std::cin >> hex;
      auto d = ferry::MemoryDesc::Unpack(Unhex(hex));
      auto s = d.ok() ? (*engine)->OpenSession(*desc, *d) : ferry::Result<ferry::Session>(d.status());
      if (s.ok()) session = *s;
      std::cout << (s.ok() ? "SESSION " + s->path().transport : "ERR " + code(s.status())) << std::endl;
    } else if (cmd == "write" || cmd == "read") {
      uint64_t l = 0, r = 0, n = 0;
      std::cin >> l >> r >> n;
      ferry::Status s = cmd == "write" ? session.Write(l, r, n).Wait() : session.Read(l, r, n).Wait();
      std::cout << "DONE " << code(s) << std::endl;
    } else if (cmd == "writes") {
      uint64_t count = 0, n = 0;
      std::cin >> count >> n;
      ferry::Status first;
      for (uint64_t i = 0; i < count && first.ok(); ++i) first = session.Write(0, 0, n).Wait();
      std::cout << "DONE " << code(first) << std::endl;
    } else if (cmd == "notify") {
      uint64_t count = 0, size = 0;
      std::cin >> count >> size;
      ferry::Status first;
      uint64_t taken = 0;
      for (; taken < count; ++taken) {
        std::string m = "n" + std::to_string(taken);
        if (m.size() < size) m.resize(size, '.');
        first = (*engine)->Notify(peer_key, m);
        if (!first.ok()) break;
      }
      std::cout << "NOTIFIED " << taken << " " << code(first) << std::endl;
    } else if (cmd == "exit") {
      break;
    }
  }
  return 0;
}
