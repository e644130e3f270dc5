// Worker: application threads take the UCX worker only when it is free (never waiting behind
// the progress thread), never overtake work submitted before them, and in Progress::kShared
// mode receive active messages themselves while the progress thread steps back; when they
// stop polling, the progress thread receives again.
#include "transport/ucx/worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace ferry::internal::ucx {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr unsigned kTestAm = 7;

class Context {
 public:
  Context() {
    ucp_params_t params = {};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;
    EXPECT_EQ(ucp_init(&params, nullptr, &context_), UCS_OK);
  }
  ~Context() { ucp_cleanup(context_); }
  ucp_context_h get() const { return context_; }

 private:
  ucp_context_h context_ = nullptr;
};

std::unique_ptr<Worker> MakeWorker(const Context& c, UcxOptions::Progress mode) {
  auto w = Worker::Create(c.get(), mode);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return w.ok() ? std::move(w).value() : nullptr;
}

TEST(UcxWorker, HeldOnlyByTheThreadInsideTheWorker) {
  Context c;
  auto w = MakeWorker(c, UcxOptions::Progress::kEvent);
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->Start(nullptr, nullptr).ok());
  EXPECT_FALSE(w->Held());
  std::promise<bool> on_thread;
  ASSERT_TRUE(w->Submit([&] { on_thread.set_value(w->Held()); }));
  auto f = on_thread.get_future();
  ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(f.get());
  bool inside = false;
  auto probe = [&] { inside = w->Held(); };
  // The progress thread may hold the worker at this instant: retry until it is free.
  auto until = Clock::now() + 5s;
  while (!w->TryRun(probe) && Clock::now() < until) std::this_thread::yield();
  EXPECT_TRUE(inside);
  EXPECT_FALSE(w->Held());
  EXPECT_GE(w->direct_runs(), 1u);
}

// Work submitted before a TryRun runs before it: a TryRun that finds work queued declines.
TEST(UcxWorker, TryRunNeverOvertakesQueuedWork) {
  Context c;
  auto w = MakeWorker(c, UcxOptions::Progress::kEvent);
  ASSERT_TRUE(w);
  std::vector<int> order;  // touched holding the worker only
  ASSERT_TRUE(w->Submit([&] { order.push_back(1); }));
  auto second = [&] { order.push_back(2); };
  EXPECT_FALSE(w->TryRun(second)) << "ran before the work queued ahead of it";
  ASSERT_TRUE(w->Start(nullptr, nullptr).ok());
  auto until = Clock::now() + 5s;
  while (!w->TryRun(second) && Clock::now() < until) std::this_thread::yield();
  w->Stop(nullptr);  // joins the thread: `order` is ours again
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  // Stopped: nothing runs from the outside any more.
  auto third = [&] { order.push_back(3); };
  EXPECT_FALSE(w->TryRun(third));
  EXPECT_FALSE(w->TryProgress());
  EXPECT_FALSE(w->Submit([] {}));
  EXPECT_EQ(order.size(), 2u);
}

// While the progress thread holds the worker (here: a long task), application threads get a
// prompt "no" rather than waiting.
TEST(UcxWorker, ApplicationThreadsNeverWaitBehindTheProgressThread) {
  Context c;
  auto w = MakeWorker(c, UcxOptions::Progress::kShared);
  ASSERT_TRUE(w);
  ASSERT_TRUE(w->Start(nullptr, nullptr).ok());
  std::promise<void> started;
  std::promise<void> release;
  auto released = release.get_future().share();
  ASSERT_TRUE(w->Submit([&started, released] {
    started.set_value();
    released.wait_for(10s);
  }));
  ASSERT_EQ(started.get_future().wait_for(5s), std::future_status::ready);
  auto t0 = Clock::now();
  bool ran = false;
  auto fn = [&] { ran = true; };
  EXPECT_FALSE(w->TryProgress());
  EXPECT_FALSE(w->TryRun(fn));
  EXPECT_LT(Clock::now() - t0, 100ms);
  EXPECT_FALSE(ran);
  release.set_value();
}

// With operations outstanding the progress thread keeps polling after UCX last made progress
// (Worker::kOutstandingSpin) instead of sleeping on the event fd after kSpin: the fd does not
// fire when a full TCP socket drains, and a sender asleep there finished a batch only at its
// 1 ms timeouts. With nothing outstanding it still sleeps after kSpin.
TEST(UcxWorker, KeepsPollingWhileOperationsAreOutstanding) {
  static_assert(Worker::kOutstandingSpin >= 4 * Worker::kSpin);
  Context c;
  auto w = MakeWorker(c, UcxOptions::Progress::kEvent);
  ASSERT_TRUE(w);
  std::atomic<bool> outstanding{true};
  ASSERT_TRUE(w->Start(nullptr, [&] { return outstanding.load(); }).ok());
  // Work run on the thread counts as progress: the spin starts again from there. Watched for
  // half of kOutstandingSpin (several times kSpin) in short naps that leave the core to the
  // progress thread: one that slept on the fd after kSpin is seen asleep there.
  const auto watch = Worker::kOutstandingSpin / 2;
  int slept = 0, looks = 0;
  // Many rounds: on a loaded machine a nap oversleeps the watch and few looks count.
  for (int round = 0; round < 40; ++round) {
    // The watch runs from when the work ran, so that this thread being late to look cannot
    // stretch it past kOutstandingSpin.
    std::promise<Clock::time_point> ran;
    ASSERT_TRUE(w->Submit([&ran] { ran.set_value(Clock::now()); }));
    auto at = ran.get_future();
    ASSERT_EQ(at.wait_for(5s), std::future_status::ready);
    const auto until = at.get() + watch;
    for (;;) {
      std::this_thread::sleep_for(20us);
      const bool asleep = w->asleep();
      if (Clock::now() >= until) break;  // a look after the watch does not count
      slept += asleep;
      ++looks;
    }
  }
  EXPECT_EQ(slept, 0) << "the progress thread slept on the event fd with operations outstanding (" << slept
                      << " of " << looks << " looks)";
  // Nothing outstanding: it goes to sleep (after kSpin of polling).
  outstanding = false;
  ASSERT_TRUE(w->Submit([] {}));
  auto until = Clock::now() + 5s;
  while (!w->asleep() && Clock::now() < until) std::this_thread::sleep_for(100us);
  EXPECT_TRUE(w->asleep());
  w->Stop(nullptr);
}

// A raw UCX worker of this process that sends active messages to `to`'s address.
class Sender {
 public:
  Sender(const Context& c, const ucp_address_t* to) {
    ucp_worker_params_t wp = {};
    EXPECT_EQ(ucp_worker_create(c.get(), &wp, &worker_), UCS_OK);
    ucp_ep_params_t ep = {};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address = to;
    EXPECT_EQ(ucp_ep_create(worker_, &ep, &ep_), UCS_OK);
  }
  ~Sender() {
    ucp_request_param_t p = {};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* req = ucp_ep_close_nbx(ep_, &p);
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    ucp_worker_destroy(worker_);
  }
  void Send(uint64_t value) {
    ucp_request_param_t p = {};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    void* req = ucp_am_send_nbx(ep_, kTestAm, nullptr, 0, &value, sizeof(value), &p);
    auto until = Clock::now() + 5s;
    while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
           Clock::now() < until)
      ucp_worker_progress(worker_);
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
  }
  void Progress() { ucp_worker_progress(worker_); }

 private:
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
};

struct Received {
  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> on_app{0};  // handled on the application (test) thread
  std::thread::id app;
};

ucs_status_t OnTestAm(void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
  auto* r = static_cast<Received*>(arg);
  if (std::this_thread::get_id() == r->app) r->on_app.fetch_add(1, std::memory_order_relaxed);
  r->count.fetch_add(1, std::memory_order_release);
  return UCS_OK;
}

TEST(UcxWorker, SharedModeReceivesOnThePollingThreadWhileTheProgressThreadStepsBack) {
  Context c;
  auto w = MakeWorker(c, UcxOptions::Progress::kShared);
  ASSERT_TRUE(w);
  Received got;
  got.app = std::this_thread::get_id();
  ucp_am_handler_param_t am = {};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kTestAm;
  am.cb = &OnTestAm;
  am.arg = &got;
  ASSERT_EQ(ucp_worker_set_am_recv_handler(w->handle(), &am), UCS_OK);
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  ASSERT_EQ(ucp_worker_get_address(w->handle(), &address, &address_length), UCS_OK);
  ASSERT_TRUE(w->Start(nullptr, nullptr).ok());
  {
    Sender sender(c, address);
    uint64_t sent = 0;
    bool saw_asleep = false;
    // Sends one message and polls until it was handled.
    auto round_trip = [&] {
      sender.Send(sent++);
      auto until = Clock::now() + 5s;
      while (got.count.load(std::memory_order_acquire) < sent && Clock::now() < until) {
        sender.Progress();
        w->TryProgress();
        saw_asleep = saw_asleep || w->asleep();
      }
      return got.count.load() == sent;
    };
    // Warm-up: polling until the progress thread was seen stepping back (on a loaded machine
    // it may not get a core at once, and it takes some messages before it steps back).
    const auto give_up = Clock::now() + 20s;
    while (!(saw_asleep && w->step_backs() > 0) && Clock::now() < give_up)
      ASSERT_TRUE(round_trip());
    EXPECT_TRUE(saw_asleep);
    ASSERT_GE(w->step_backs(), 1u);
    // Polling: each message is handled by this thread while the progress thread stays back
    // (it comes out about every 20 ms for its tick, and may take a message then).
    const uint64_t app_before = got.on_app.load();
    const uint64_t kMessages = 200;
    for (uint64_t i = 0; i < kMessages; ++i)
      ASSERT_TRUE(round_trip()) << "message " << sent - 1 << " lost";
    EXPECT_GE(got.on_app.load() - app_before, kMessages * 9 / 10)
        << "handled on the progress thread: " << kMessages - (got.on_app.load() - app_before);
    EXPECT_GE(w->app_progress(), got.on_app.load());  // each needs a TryProgress of its own
    const uint64_t messages = sent;

    // The application stops polling: the progress thread receives again, within the window.
    uint64_t before_app = got.on_app.load();
    sender.Send(messages);
    auto until = Clock::now() + 5s;
    while (got.count.load(std::memory_order_acquire) <= messages && Clock::now() < until) {
      sender.Progress();
      std::this_thread::sleep_for(100us);
    }
    EXPECT_EQ(got.count.load(), messages + 1) << "the progress thread did not take over";
    EXPECT_EQ(got.on_app.load(), before_app);
    w->Stop(nullptr);  // before the sender's endpoint goes
  }
  ucp_worker_release_address(w->handle(), address);
}

}  // namespace
}  // namespace ferry::internal::ucx
