// Helpers of the service tests: a small synthetic model, a server on a temporary socket (and a
// fixture holding one), clients and raw registrations of that model, and checks of output rows
// against the synthetic pattern at independently computed row ids.
//
// Thread safety: plain functions; a RawRank, like the fixture, belongs to one test thread.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "embed/config.h"
#include "embed/row_ids.h"
#include "embed/service/host_flag.h"
#include "embed/service/protocol.h"
#include "embed/service/shared_memory.h"
#include "embed/service/unix_socket.h"
#include "testing/embed_core.h"
#include "ferry/embed.h"
#include "ferry/embed_server.h"
#include "ferry/embed_service.h"

namespace ferry::embed::service::testing {

// V 1000, EOS 2, N 3, H 2 (G 4), E 64 (d 16, bf16: 32-byte rows, 128-byte tokens), B 97, P 8.
inline Config SmallConfig(int layer) {
  Config c = embed::testing::ConfigOf({1000, 2, 3, 2, 16, 97, 8});
  c.layer = layer;
  return c;
}
inline constexpr uint64_t kTokenBytes = 64 * 2;
inline const std::vector<uint32_t> kLayers = {0, 1, 2};

// A socket path in /tmp named after `name` (a parametrised test's name, '/' and all).
inline std::string TempSocketPath(std::string name) {
  std::replace(name.begin(), name.end(), '/', '-');
  return "/tmp/ferry-embed-" + std::to_string(::getpid()) + "-" + name + ".sock";
}

// The served layers: one synthetic table large enough for every layer's rows.
inline std::vector<ServedLayer> SmallLayers() {
  std::vector<Layout> layouts;
  uint64_t rows = 0;
  for (uint32_t l : kLayers) {
    Result<Layout> layout = Layout::Create(SmallConfig(static_cast<int>(l)));
    EXPECT_TRUE(layout.ok()) << layout.status().ToString();
    rows = std::max(rows, layout->table_rows());
    layouts.push_back(*layout);
  }
  Result<std::unique_ptr<Table>> table = Table::Synthetic(layouts[0], Dtype::kBf16, nullptr, rows);
  EXPECT_TRUE(table.ok()) << table.status().ToString();
  std::shared_ptr<const Table> shared = std::move(table).value();
  std::vector<ServedLayer> out;
  for (auto& l : layouts) out.push_back(ServedLayer{l, shared});
  return out;
}

inline ServerOptions SmallServerOptions(const std::string& path) {
  ServerOptions o;
  o.socket_path = path;
  o.gather.threads = 2;
  o.gather.chunk_tokens = 16;
  o.wait_timeout = std::chrono::seconds(5);
  return o;
}

inline ClientOptions SmallClientOptions(const std::string& path, uint32_t dp, uint32_t tp,
                                        uint32_t tp_size) {
  ClientOptions o;
  o.socket_path = path;
  o.dp_rank = dp;
  o.tp_rank = tp;
  o.tp_size = tp_size;
  o.max_tokens = 512;
  o.max_reqs = 64;
  o.context_len = 2;
  o.token_bytes = kTokenBytes;
  o.layers = kLayers;
  o.connect_timeout = std::chrono::seconds(10);
  o.step_timeout = std::chrono::seconds(5);
  return o;
}

struct StepData {
  std::vector<int32_t> tokens, qsl, ctx;
};

// num_tokens tokens in num_reqs equal requests (the last takes the rest), ids with EOS and
// negative padding ids sprinkled in.
inline StepData MakeStep(uint32_t num_reqs, uint32_t num_tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  StepData s;
  for (uint32_t i = 0; i < num_tokens; ++i) {
    uint32_t r = rng() % 100;
    s.tokens.push_back(r < 5 ? 2 : r < 7 ? -1 : static_cast<int32_t>(rng() % 1000));
  }
  for (uint32_t r = 0; r <= num_reqs; ++r)
    s.qsl.push_back(r == num_reqs ? num_tokens : r * (num_tokens / num_reqs));
  for (uint32_t i = 0; i < num_reqs * 2; ++i) s.ctx.push_back(static_cast<int32_t>(rng() % 1000));
  return s;
}

// Copies `v` to dst; an empty `v` touches neither pointer.
inline void CopyInts(void* dst, const std::vector<int32_t>& v) {
  if (!v.empty()) std::memcpy(dst, v.data(), v.size() * 4);
}

inline void WriteInputs(Client& c, const StepData& s) {
  CopyInts(c.input_ids().data(), s.tokens);
  CopyInts(c.query_start_loc().data(), s.qsl);
  CopyInts(c.ngram_context().data(), s.ctx);
}

// Checks every byte of the first num_tokens rows at `got` (the output of layer slot `slot`)
// against SyntheticRow at the row ids.
inline void ExpectRowsAt(const uint8_t* got, size_t slot, const StepData& s) {
  Result<Layout> layout = Layout::Create(SmallConfig(static_cast<int>(kLayers[slot])));
  ASSERT_TRUE(layout.ok());
  StepInput in{s.tokens, s.qsl, s.ctx};
  const int G = layout->num_heads();
  std::vector<uint64_t> ids(s.tokens.size() * G);
  ASSERT_TRUE(ComputeRowIds(*layout, in, ids).ok());
  const uint64_t row_bytes = kTokenBytes / G;
  std::vector<uint8_t> want(row_bytes);
  for (size_t t = 0; t < s.tokens.size(); ++t) {
    for (int h = 0; h < G; ++h) {
      uint64_t id = ids[t * G + h];
      if (id == kPaddingRow)
        std::fill(want.begin(), want.end(), 0);
      else
        SyntheticRow(id, row_bytes, want.data());
      ASSERT_EQ(std::memcmp(got + (t * G + h) * row_bytes, want.data(), row_bytes), 0)
          << "slot " << slot << " token " << t << " head " << h;
    }
  }
}

// The same for a host-mode client's output of `slot`.
inline void ExpectRows(Client& c, size_t slot, const StepData& s) {
  ExpectRowsAt(c.output(slot).data(), slot, s);
}

// A server of the small model; null (and a test failure) when it does not start.
inline std::unique_ptr<Server> StartServer(const ServerOptions& o) {
  Result<std::unique_ptr<Server>> s = Server::Create(o, SmallLayers());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

// A host-mode client of the small model; null (and a test failure) when it does not register.
inline std::unique_ptr<Client> MakeClient(const std::string& path, uint32_t dp, uint32_t tp,
                                          uint32_t tp_size) {
  Result<std::unique_ptr<Client>> c = Client::Create(SmallClientOptions(path, dp, tp, tp_size));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// The server's counts once `steps` steps are counted, or after 5 s. A step is counted after its
// last layer is flagged done, so a client that has seen its rows may look a moment too soon.
template <typename Server>
auto StatsAfter(Server& server, uint64_t steps) {
  auto s = server.stats();
  for (int i = 0; i < 500 && s.steps_ok + s.steps_failed < steps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = server.stats();
  }
  return s;
}

// One forward of every rank of a host-mode group: rank 0 writes the inputs, every rank
// prepares, waits for and checks each layer's rows, then every rank releases.
inline void Forward(const std::vector<Client*>& ranks, const StepData& s) {
  WriteInputs(*ranks[0], s);
  for (Client* c : ranks)
    ASSERT_TRUE(c->PrepareForward(s.qsl.size() - 1, s.tokens.size(), false).ok());
  for (Client* c : ranks) {
    for (size_t slot = 0; slot < c->slots(); ++slot) {
      Status w = c->Wait(slot);
      ASSERT_TRUE(w.ok()) << w.ToString();
      ExpectRows(*c, slot, s);
    }
  }
  for (Client* c : ranks) ASSERT_TRUE(c->ReleaseOutputs().ok());
}

// A fixture: a server of the small model on a socket named after the test.
class SmallServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempSocketPath(::testing::UnitTest::GetInstance()->current_test_info()->name());
    server_ = StartServer(SmallServerOptions(path_));
    ASSERT_TRUE(server_);
  }
  std::unique_ptr<Client> MakeClient(uint32_t dp, uint32_t tp, uint32_t tp_size) {
    return testing::MakeClient(path_, dp, tp, tp_size);
  }

  std::string path_;
  std::unique_ptr<Server> server_;
};

// A connection to the service at `path` (5 s at the most).
inline Result<UniqueFd> ConnectTo(const std::string& path) {
  return Connect(path, Deadline::After(std::chrono::seconds(5)));
}

// The next message on `fd`, decoded.
inline Result<AnyMessage> NextMessage(int fd,
                                      std::chrono::milliseconds wait = std::chrono::seconds(5)) {
  Result<Message> m = Receive(fd, Deadline::After(wait));
  if (!m.ok()) return m.status();
  return Decode(m->bytes);
}

// The registration of host-mode rank `tp` of `tp_size` in data-parallel group `dp` that a
// client of SmallClientOptions sends: the three layers' outputs one after the other in the
// outputs memfd, then their flags 64 bytes apart; rank 0 brings the inputs.
inline Register SmallRegister(uint32_t dp, uint32_t tp, uint32_t tp_size) {
  Register reg = RegisterOf(SmallClientOptions("", dp, tp, tp_size));
  for (size_t i = 0; i < reg.layers.size(); ++i) {
    reg.layers[i].output_offset = i * 512 * kTokenBytes;
    reg.layers[i].flag_offset = reg.layers.size() * 512 * kTokenBytes + 64 * i;
  }
  reg.has_inputs = tp == 0;
  if (reg.has_inputs) reg.inputs = {0, 2048, 2560};
  return reg;
}

// Tensor-parallel rank 0 of a group of one over a raw connection (host mode), for tests that
// send bytes of their choosing or several steps without releasing.
struct RawRank {
  Register reg;
  std::unique_ptr<SharedMemory> out, in;
  UniqueFd fd;

  uint32_t* flag(size_t slot) {
    return reinterpret_cast<uint32_t*>(out->data() + reg.layers[slot].flag_offset);
  }
  void SetFlags(uint32_t v) {
    for (size_t i = 0; i < reg.layers.size(); ++i) StoreFlag(flag(i), v);
  }
  void Write(const StepData& s) {
    CopyInts(in->data() + reg.inputs.ids, s.tokens);
    CopyInts(in->data() + reg.inputs.query_start_loc, s.qsl);
    CopyInts(in->data() + reg.inputs.ngram_context, s.ctx);
  }
  // The next message from the service.
  Result<AnyMessage> Next(std::chrono::milliseconds wait = std::chrono::seconds(5)) {
    return NextMessage(fd.get(), wait);
  }
  // The next message, which must be a Reply.
  Reply NextReply() {
    Result<AnyMessage> m = Next();
    EXPECT_TRUE(m.ok() && std::holds_alternative<Reply>(*m)) << m.status().ToString();
    return m.ok() && std::holds_alternative<Reply>(*m) ? std::get<Reply>(*m) : Reply{0, m.status()};
  }
};

// Registers `dp` as rank 0 of 1 (512 tokens, 64 requests, the three layers); null on failure.
inline std::unique_ptr<RawRank> RegisterRaw(const std::string& path, uint32_t dp) {
  auto r = std::make_unique<RawRank>();
  Result<std::unique_ptr<SharedMemory>> out =
      SharedMemory::Create("raw-out", 3 * 512 * kTokenBytes + 4096);
  Result<std::unique_ptr<SharedMemory>> in = SharedMemory::Create("raw-in", 8192);
  if (!out.ok() || !in.ok()) return nullptr;
  r->out = std::move(out).value();
  r->in = std::move(in).value();
  r->reg = SmallRegister(dp, 0, 1);
  Result<UniqueFd> fd = ConnectTo(path);
  if (!fd.ok()) return nullptr;
  r->fd = std::move(fd).value();
  int fds[] = {r->out->fd(), r->in->fd()};
  if (!Send(r->fd.get(), Encode(r->reg), fds).ok()) return nullptr;
  Result<AnyMessage> m = r->Next();
  if (!m.ok() || !std::holds_alternative<Registered>(*m) || !std::get<Registered>(*m).status.ok())
    return nullptr;
  return r;
}

}  // namespace ferry::embed::service::testing
