// The cross-process suite's hostile initiators, once for every transport that reaches other
// processes (the instances of process_conformance_test.cc, in its binary): a ferry_test_peer
// child opens sessions to this process's regions with descriptors forged larger, moved, of
// another kind, with another region's id or access entry, or of a deregistered region, and
// floods this process with notifications over its limits. Each is refused with the code the
// transport gives (a field of ProcessCase where they differ, with the reason), counted where
// the transport counts it, moves no byte outside the region (guard bytes around it), and the
// engine serves a well-formed transfer after. Cases that craft one transport's wire messages
// stay in its own file (shm_hostile_test.cc, ucx_hostile_test.cc).
#include <gtest/gtest.h>

#include <thread>

#include "base/tsan.h"
#include "ferry/engine.h"
#include "testing/cuda_buffer.h"
#include "testing/process_rig.h"

namespace ferry {
namespace {

using namespace process_testing;  // NOLINT: test helpers
using namespace std::chrono_literals;

constexpr uint64_t kRegion = 64 << 10;
constexpr uint64_t kGuard = 4096;

class ProcessHostile : public ::testing::TestWithParam<ProcessCase> {
 protected:
  void SetUp() override {
    if (GetParam().gpu) {
      FERRY_SKIP_WITHOUT_CUDA(1);
    }
  }
  const ProcessCase& c() const { return GetParam(); }
};

// The test reads the regions between the child's answers and its next commands, which order
// the reads after the child's earlier transfers into them and before its later ones, through
// a pipe and another process; UCX's one-sided puts land from inside UCX, with nothing of
// ferry's to annotate. TSan sees none of that: it ignores these reads (as .sanitizers/tsan.supp
// does the child's own).
#ifdef FERRY_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
struct IgnoreReads {
  IgnoreReads() { AnnotateIgnoreReadsBegin(__FILE__, __LINE__); }
  ~IgnoreReads() { AnnotateIgnoreReadsEnd(__FILE__, __LINE__); }
};
#else
struct IgnoreReads {};
#endif

// This process as the target of a hostile child: an engine with only the case's transport and
// two regions, A and B. Host memory: one buffer, guard | A | guard | B | guard. GPU memory
// (cuda_ipc bounds a region by its allocation, see ProcessCase::checks_address): A and B are
// allocations of their own.
struct Target {
  std::unique_ptr<Rig> rig;
  std::unique_ptr<cuda_testing::Buffer> gpu_b;
  MemoryDesc a, b;
  uint64_t a_at = 0;  // A's offset in Contents()

  // Every byte this side holds: the host buffer with its guards, or A's and B's allocations.
  std::vector<uint8_t> Contents() const {
    [[maybe_unused]] IgnoreReads ignore;
    auto all = rig->Contents();
    if (gpu_b) {
      auto more = gpu_b->Download();
      all.insert(all.end(), more.begin(), more.end());
    }
    return all;
  }
  std::string HashOfA() const {
    [[maybe_unused]] IgnoreReads ignore;
    return rig->HashOfLocal(a_at, kRegion);
  }
};

// `small_inbox`: notifications of 4 KiB at most, 8 of them held.
std::unique_ptr<Target> MakeTarget(const ProcessCase& c, bool small_inbox = false) {
  ProcessCase only = c;
  only.local_transports = {c.transport};
  if (small_inbox) {
    only.options.max_notification_bytes = 4096;
    only.options.max_pending_notifications = 8;
  }
  auto t = std::make_unique<Target>();
  t->rig =
      MakeRig(only, c.gpu ? kRegion : 3 * kGuard + 2 * kRegion, /*with_peer=*/false, c.only_alloc);
  if (!t->rig) return nullptr;
  Engine& e = *t->rig->engine;
  if (c.gpu) {
    t->a = t->rig->local;
    t->gpu_b = cuda_testing::Buffer::Make(cuda_testing::kGpu0, kRegion);
    if (!t->gpu_b) return nullptr;
    t->gpu_b->Upload(testing::RandomBytes(kRegion, 43));
    auto b = e.RegisterMemory(t->gpu_b->ptr(), kRegion, MemoryKind::kCuda, 0);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return nullptr;
    t->b = *b;
    return t;
  }
  EXPECT_TRUE(e.DeregisterMemory(t->rig->local).ok());
  t->a_at = kGuard;
  auto a = e.RegisterMemory(t->rig->host.data() + kGuard, kRegion);
  auto b = e.RegisterMemory(t->rig->host.data() + 2 * kGuard + kRegion, kRegion);
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return nullptr;
  t->a = *a;
  t->b = *b;
  return t;
}

// The hostile child: an engine with the case's transport only (no fallback to another), a
// buffer of `bytes`, this process's engine added as its peer.
std::unique_ptr<PeerProcess> StartHostile(const ProcessCase& c, const Target& t, uint64_t bytes) {
  auto child = StartPeer(c, bytes, {"--transports", c.transport});
  if (!child) return nullptr;
  EXPECT_EQ(child->Command("peer " + Hex(t.rig->engine->Describe().Pack())), "OK");
  return child;
}

std::string Answer(const ProcessCase& c, Code code) {
  return code == Code::kOk ? "SESSION " + c.transport : "ERR " + std::string(CodeName(code));
}

// Whether every byte outside [at, at + n) of `now` is as in `before`.
bool SameOutside(const std::vector<uint8_t>& now, const std::vector<uint8_t>& before, uint64_t at,
                 uint64_t n) {
  return now.size() == before.size() && std::equal(now.begin(), now.begin() + at, before.begin()) &&
         std::equal(now.begin() + at + n, now.end(), before.begin() + at + n);
}

TEST_P(ProcessHostile, ForgedDescriptorsAreRefusedAndMoveNoByte) {
  auto t = MakeTarget(c());
  ASSERT_TRUE(t);
  auto child = StartHostile(c(), *t, 2 * kRegion);
  ASSERT_TRUE(child);
  const auto before = t->Contents();
  struct Forgery {
    const char* what;
    MemoryDesc desc;
    Code code;
    bool at_target;  // refused by the target (not by the child's engine or transport)
  };
  std::vector<Forgery> forgeries;
  MemoryDesc d = t->a;
  d.size += kGuard;  // into the guard bytes after A (GPU: past its allocation)
  forgeries.push_back({"grown by a guard", d, Code::kInvalidArgument, true});
  d = t->a;
  d.size *= 2;  // over the guard and into B
  forgeries.push_back({"grown to twice", d, Code::kInvalidArgument, true});
  d = t->a;
  d.address -= kGuard;  // over the guard bytes before A
  forgeries.push_back(
      {"moved", d, c().checks_address ? Code::kInvalidArgument : Code::kOk, c().checks_address});
  d = t->a;
  d.kind = c().gpu ? MemoryKind::kHost : MemoryKind::kCuda;
  d.device = c().gpu ? -1 : 0;
  forgeries.push_back({"of another kind", d, c().changed_kind_code, false});
  d = t->a;
  d.region = t->b.region;  // B's id with A's access entry
  forgeries.push_back({"with B's id", d, c().foreign_region_code, true});
  d = t->a;
  d.access = t->b.access;  // A's id with B's access entry (B's key)
  forgeries.push_back({"with B's access", d, c().foreign_region_code, true});

  uint64_t counted = 0;
  bool a_written = false;  // by a forgery the transport takes
  for (const Forgery& f : forgeries) {
    SCOPED_TRACE(f.what);
    const std::string answer = child->Command("open " + Hex(f.desc.Pack()));
    EXPECT_EQ(answer, Answer(c(), f.code));
    if (answer.rfind("SESSION", 0) == 0) {
      // Taken: what the child writes through it lands in A, and nothing outside A moves.
      const std::string n = std::to_string(std::min<uint64_t>(f.desc.size, 2 * kRegion));
      EXPECT_EQ(child->Command("write 0 0 " + n), "DONE OK");
      EXPECT_EQ(t->HashOfA(), child->Command(Rig::HashCmd(0, kRegion)));
      EXPECT_EQ(child->Command("read 0 0 " + n), "DONE OK");
      a_written = true;
    }
    counted += c().counts_refused_opens && f.at_target && f.code != Code::kOk;
    if (a_written) {
      EXPECT_TRUE(SameOutside(t->Contents(), before, t->a_at, kRegion)) << "a byte outside A moved";
    } else {
      EXPECT_EQ(t->Contents(), before) << "a refused descriptor moved bytes";
    }
  }
  // The target counted what it refused (shm), within a moment: the refusal is sent first.
  auto until = Clock::now() + 5s;
  while (t->rig->engine->stats().rejected_messages < counted && Clock::now() < until)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(t->rig->engine->stats().rejected_messages, counted);

  // The engine serves a well-formed session after: a write and a read of A.
  ASSERT_EQ(child->Command("open " + Hex(t->a.Pack())), Answer(c(), Code::kOk));
  ASSERT_EQ(child->Command("fill 5"), "OK");
  ASSERT_EQ(child->Command("write 0 0 " + std::to_string(kRegion)), "DONE OK");
  EXPECT_EQ(t->HashOfA(), child->Command(Rig::HashCmd(0, kRegion)));
  ASSERT_EQ(child->Command("read " + std::to_string(kRegion) + " 0 " + std::to_string(kRegion)),
            "DONE OK");
  EXPECT_EQ(t->HashOfA(), child->Command(Rig::HashCmd(kRegion, kRegion)));
  EXPECT_TRUE(SameOutside(t->Contents(), before, t->a_at, kRegion)) << "a byte outside A moved";
  if (c().gpu) (void)child->Command("exit");
}

// A region deregistered under an open session: the child's transfers on it and a new session
// to it are refused with kFailedPrecondition (Engine::DeregisterMemory), and its bytes stay
// as they are; the same memory registered again is reached again.
TEST_P(ProcessHostile, DeregisteredRegionIsRefused) {
  auto t = MakeTarget(c());
  ASSERT_TRUE(t);
  auto child = StartHostile(c(), *t, kRegion);
  ASSERT_TRUE(child);
  const std::string open_a = "open " + Hex(t->a.Pack());
  const std::string whole = " 0 0 " + std::to_string(kRegion);
  ASSERT_EQ(child->Command(open_a), Answer(c(), Code::kOk));
  ASSERT_EQ(child->Command("write" + whole), "DONE OK");
  ASSERT_TRUE(t->rig->engine->DeregisterMemory(t->a).ok());
  const auto before = t->Contents();
  EXPECT_EQ(child->Command("write" + whole), "DONE FAILED_PRECONDITION");
  EXPECT_EQ(child->Command("read" + whole), "DONE FAILED_PRECONDITION");
  EXPECT_EQ(child->Command(open_a), "ERR FAILED_PRECONDITION");
  EXPECT_EQ(t->Contents(), before) << "a transfer reached a deregistered region";

  // Registered again (a new id and key), the same memory is reached again.
  void* a_ptr = c().gpu ? t->rig->gpu->ptr() : static_cast<void*>(t->rig->host.data() + kGuard);
  auto again = t->rig->engine->RegisterMemory(a_ptr, kRegion, t->a.kind, t->a.device);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(child->Command("open " + Hex(again->Pack())), Answer(c(), Code::kOk));
  ASSERT_EQ(child->Command("fill 6"), "OK");
  ASSERT_EQ(child->Command("write" + whole), "DONE OK");
  EXPECT_EQ(t->HashOfA(), child->Command(Rig::HashCmd(0, kRegion)));
  if (c().gpu) (void)child->Command("exit");
}

// A child sends notifications over this engine's limits: one larger than
// max_notification_bytes (refused by the sender or dropped here, ProcessCase::
// oversize_refused_by_sender), and a flood past max_pending_notifications (the ones past the
// backlog dropped and counted, the first ones kept in order). The engine takes the next.
TEST_P(ProcessHostile, NotificationsOverTheReceiversLimitsAreRefusedOrDropped) {
  if (!c().carries_notifications) {
    GTEST_SKIP() << c().transport << " carries no notifications (its engines notify over ucx)";
  }
  auto t = MakeTarget(c(), /*small_inbox=*/true);
  ASSERT_TRUE(t);
  Engine& e = *t->rig->engine;
  auto child = StartHostile(c(), *t, 4096);
  ASSERT_TRUE(child);
  const std::string key = child->engine.key;
  auto pop = [&](size_t want) {
    std::vector<Notification> got;
    auto until = Clock::now() + 5s;
    while (got.size() < want && Clock::now() < until) {
      for (auto& n : e.PopNotifications()) got.push_back(std::move(n));
      std::this_thread::sleep_for(1ms);
    }
    return got;
  };
  auto dropped = [&](uint64_t want) {
    auto until = Clock::now() + 5s;
    while (e.stats().dropped_notifications < want && Clock::now() < until)
      std::this_thread::sleep_for(2ms);
    return e.stats().dropped_notifications;
  };
  ASSERT_EQ(child->Command("notify 1 4096"), "NOTIFIED 1 OK");  // at the limit: taken
  auto got = pop(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].from, key);
  EXPECT_EQ(got[0].message.size(), 4096u);

  // One byte over: within the allowance for a topic's frame that the transports carry, so
  // it reaches this engine, which drops it and counts it.
  EXPECT_EQ(child->Command("notify 1 4097"), "NOTIFIED 1 OK");
  EXPECT_EQ(dropped(1), 1u);
  // Twice the limit: past the frame's allowance too.
  if (c().oversize_refused_by_sender) {
    EXPECT_EQ(child->Command("notify 1 8192"), "NOTIFIED 0 INVALID_ARGUMENT");
  } else {
    EXPECT_EQ(child->Command("notify 1 8192"), "NOTIFIED 1 OK");
    EXPECT_EQ(dropped(2), 2u);
  }
  const uint64_t oversize_dropped = e.stats().dropped_notifications;

  // 40 small ones, none taken meanwhile: 8 kept, 32 dropped.
  EXPECT_EQ(child->Command("notify 40 8"), "NOTIFIED 40 OK");
  EXPECT_EQ(dropped(oversize_dropped + 32), oversize_dropped + 32);
  got = pop(8);
  ASSERT_EQ(got.size(), 8u);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i].message, "n" + std::to_string(i) + std::string(6, '.'));
  EXPECT_TRUE(e.PopNotifications().empty());
  EXPECT_EQ(e.stats().rejected_messages, 0u) << "refused or dropped, not malformed";

  // The receiver takes the next one.
  ASSERT_EQ(child->Command("notify 1 3"), "NOTIFIED 1 OK");
  got = pop(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "n0.");
  EXPECT_EQ(e.stats().dropped_notifications, oversize_dropped + 32);
}

INSTANTIATE_TEST_SUITE_P(Transports, ProcessHostile, ::testing::ValuesIn(ProcessCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace ferry
