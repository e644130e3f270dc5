// What the engine hands its transports (TransportContext): one set of GPU copy engines per
// engine, the same object for every transport of that engine, another for another engine, and
// alive until the engine and its transports are gone. Transports that only record their
// context stand in for real ones, so that this runs on any machine, with or without CUDA.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "base/mutex.h"
#include "cuda/copy_engine.h"
#include "cuda/runtime.h"
#include "engine/engine_core.h"

namespace ferry::internal {
namespace {

struct Seen {
  std::string engine_key;
  std::string transport;
  std::shared_ptr<cuda::CopyEngines> copy_engines;
};
Mutex g_mu;
std::vector<Seen> g_seen GUARDED_BY(g_mu);

std::vector<Seen> TakeSeen() {
  MutexLock lock(&g_mu);
  std::vector<Seen> out;
  out.swap(g_seen);
  return out;
}

// Carries host memory in this process and reaches no peer; keeps nothing of its context.
class RecordingTransport final : public Transport {
 public:
  explicit RecordingTransport(std::string_view name) : name_(name) {}
  std::string_view name() const override { return name_; }
  Capabilities caps() const override {
    Capabilities c;
    c.host_memory = true;
    return c;
  }
  TransportData Describe() const override { return TransportData{std::string(name_), ""}; }
  Result<TransportData> Register(const std::shared_ptr<Region>&) override {
    return TransportData{std::string(name_), ""};
  }
  Status Deregister(const Region&) override { return Status::Ok(); }
  bool CanReach(const EngineDesc&) const override { return false; }
  Result<std::shared_ptr<Endpoint>> Connect(const EngineDesc& peer) override {
    return Status(Code::kUnavailable, "the recording transport reaches no peer " + peer.key);
  }

 private:
  std::string_view name_;
};

Result<std::unique_ptr<Transport>> Record(const TransportContext& ctx, std::string_view name) {
  {
    MutexLock lock(&g_mu);
    g_seen.push_back(Seen{ctx.engine_key, std::string(name), ctx.copy_engines});
  }
  return std::unique_ptr<Transport>(new RecordingTransport(name));
}
Result<std::unique_ptr<Transport>> MakeFirst(const TransportContext& ctx) { return Record(ctx, "first"); }
Result<std::unique_ptr<Transport>> MakeSecond(const TransportContext& ctx) { return Record(ctx, "second"); }

const TransportEntry kEntries[] = {{"first", &MakeFirst}, {"second", &MakeSecond}};

std::shared_ptr<EngineCore> MakeEngine(const std::string& key) {
  EngineOptions options;
  options.key = key;
  auto e = EngineCore::Create(options, kEntries);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? std::move(e).value() : nullptr;
}

// One engine, and the contexts its two transports were given.
void MakeOne(const std::string& key, std::shared_ptr<EngineCore>* a, std::vector<Seen>* seen) {
  TakeSeen();
  *a = MakeEngine(key);
  ASSERT_TRUE(*a);
  *seen = TakeSeen();
  ASSERT_EQ(seen->size(), 2u);
}

TEST(TransportContext, TransportsOfOneEngineShareOneSetOfCopyEngines) {
  TakeSeen();
  auto a = MakeEngine("ctx-a");
  auto b = MakeEngine("ctx-b");
  ASSERT_TRUE(a && b);
  std::vector<Seen> seen = TakeSeen();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].engine_key, "ctx-a");
  EXPECT_EQ(seen[0].transport, "first");
  EXPECT_EQ(seen[1].engine_key, "ctx-a");
  EXPECT_EQ(seen[1].transport, "second");
  EXPECT_EQ(seen[2].engine_key, "ctx-b");
  EXPECT_EQ(seen[3].engine_key, "ctx-b");
  ASSERT_NE(seen[0].copy_engines, nullptr);
  ASSERT_NE(seen[2].copy_engines, nullptr);
  // One set per engine: the same object for both transports of an engine, another for the
  // other engine.
  EXPECT_EQ(seen[0].copy_engines.get(), seen[1].copy_engines.get());
  EXPECT_EQ(seen[2].copy_engines.get(), seen[3].copy_engines.get());
  EXPECT_NE(seen[0].copy_engines.get(), seen[2].copy_engines.get());
  // Sized by this process's devices (none without CUDA), and nothing copied yet: the engine's
  // GPU counters are the set's.
  EXPECT_EQ(seen[0].copy_engines->devices(), cuda::DeviceCount());
  EngineStats st = a->stats();
  EXPECT_EQ(st.gpu_kernel_launches, 0u);
  EXPECT_EQ(st.gpu_kernel_pieces, 0u);
  EXPECT_EQ(st.gpu_dma_calls, 0u);
  EXPECT_EQ(st.gpu_dma_copies, 0u);
}

TEST(TransportContext, TheCopyEnginesLiveAsLongAsTheEngine) {
  std::shared_ptr<EngineCore> a;
  std::vector<Seen> seen;
  ASSERT_NO_FATAL_FAILURE(MakeOne("ctx-life", &a, &seen));
  std::weak_ptr<cuda::CopyEngines> engines = seen[0].copy_engines;
  seen.clear();
  EXPECT_FALSE(engines.expired()) << "the engine holds its set while it lives";
  a->Shutdown();
  EXPECT_FALSE(engines.expired()) << "a shut-down engine may still have copies in flight";
  a.reset();
  EXPECT_TRUE(engines.expired()) << "the set goes with the engine";
}

TEST(TransportContext, ADeviceBeyondTheSetIsRefused) {
  std::shared_ptr<EngineCore> a;
  std::vector<Seen> seen;
  ASSERT_NO_FATAL_FAILURE(MakeOne("ctx-devices", &a, &seen));
  cuda::CopyEngines& set = *seen[0].copy_engines;
  // A build without CUDA has no copy engines at all; a CUDA build has none past its devices.
  const Code expected = cuda::Built() ? Code::kInvalidArgument : Code::kUnsupported;
  EXPECT_EQ(set.For(set.devices()).status().code(), expected);
  EXPECT_EQ(set.For(-1).status().code(), expected);
}

}  // namespace
}  // namespace ferry::internal
