// For engine tests: two engines over the held `local` transport (testing/held_transport.h),
// each with one host buffer of kLayers layers registered as one region per layer, and a
// session per layer from a's layer to b's (as a KV cache registered per layer is written);
// or, for a fixture made with HeldEnginesTest(kOneSession), the buffer as one region and one
// session that writes every layer.
//
// Thread safety: a test fixture, used by the test's thread; the engines are thread-safe.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_core.h"
#include "testing/bytes.h"
#include "testing/held_transport.h"

namespace ferry::internal {

class HeldEnginesTest : public ::testing::Test {
 protected:
  static constexpr int kLayers = 4;
  static constexpr uint64_t kLayer = 4096;
  enum Sessions { kSessionPerLayer, kOneSession };

  explicit HeldEnginesTest(Sessions sessions = kSessionPerLayer) : one_session_(sessions == kOneSession) {}

  void SetUp() override {
    static int counter = 0;
    const TransportEntry entries[] = {{"local", &MakeHeldLocalTransport}};
    EngineOptions options;
    options.default_deadline = std::chrono::seconds(10);
    options.key = "held-a" + std::to_string(counter);
    auto a = EngineCore::Create(options, entries);
    options.key = "held-b" + std::to_string(counter++);
    auto b = EngineCore::Create(options, entries);
    ASSERT_TRUE(a.ok() && b.ok()) << (a.ok() ? b.status().ToString() : a.status().ToString());
    a_ = *a;
    b_ = *b;
    a_buf_.assign(kLayers * kLayer, 0);
    b_buf_.assign(kLayers * kLayer, 0);
    ::ferry::testing::Fill(a_buf_, 5);
    ASSERT_TRUE(a_->AddPeer(b_->desc()).ok());
    const int regions = one_session_ ? 1 : kLayers;
    const uint64_t bytes = one_session_ ? kLayers * kLayer : kLayer;
    for (int i = 0; i < regions; ++i) {
      auto ad = a_->RegisterMemory(a_buf_.data() + i * kLayer, bytes, MemoryKind::kHost, -1);
      auto bd = b_->RegisterMemory(b_buf_.data() + i * kLayer, bytes, MemoryKind::kHost, -1);
      ASSERT_TRUE(ad.ok() && bd.ok());
      auto s = a_->OpenSession(*ad, *bd);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      sessions_.push_back(*s);
    }
  }
  void TearDown() override {
    sessions_.clear();
    if (a_) a_->Shutdown();
    if (b_) b_->Shutdown();
    HeldBatches::Get().Clear();
  }

  HeldBatches& held() { return HeldBatches::Get(); }
  // Writes layer `i` through its own session, or the one session (held until released).
  Transfer WriteLayer(int i, TransferOptions o = {}) {
    const uint64_t at = one_session_ ? i * kLayer : 0;
    TransferOp op{at, at, kLayer};
    return sessions_[one_session_ ? 0 : static_cast<size_t>(i)]->Post(Op::kWrite, std::span<const TransferOp>(&op, 1), o);
  }
  bool LayerInPlace(int i) const {
    return std::memcmp(b_buf_.data() + i * kLayer, a_buf_.data() + i * kLayer, kLayer) == 0;
  }
  // b's notifications of `topic` that arrive within `d` (stops at the first that arrive).
  std::vector<Notification> NotesWithin(std::chrono::milliseconds d, std::string_view topic = {}) {
    std::vector<Notification> got;
    auto until = std::chrono::steady_clock::now() + d;
    do {
      for (auto& n : b_->PopNotifications(topic)) got.push_back(std::move(n));
      if (!got.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } while (std::chrono::steady_clock::now() < until);
    return got;
  }

  std::shared_ptr<EngineCore> a_, b_;
  std::vector<uint8_t> a_buf_, b_buf_;
  std::vector<std::shared_ptr<SessionCore>> sessions_;

 private:
  const bool one_session_;
};

}  // namespace ferry::internal
