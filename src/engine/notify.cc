// The engine's notifications: topics (framed beside the message, transport/notify_frame.h),
// the endpoint each peer's notifications take, and notifications ordered after transfers
// (NotifyAfter).
#include <string>

#include "engine/after_gate.h"
#include "engine/engine_core.h"

namespace ferry {
namespace internal {

Result<std::string> FrameNotification(const EngineOptions& options, std::string_view topic,
                                      std::string_view message) {
  if (topic.size() > kMaxTopicBytes)
    return Status(Code::kInvalidArgument, "notification topic of " + std::to_string(topic.size()) +
                                              " bytes exceeds " + std::to_string(kMaxTopicBytes));
  if (message.size() > options.max_notification_bytes)
    return Status(Code::kInvalidArgument, "notification exceeds max_notification_bytes");
  return EncodeNotifyFrame(topic, message);
}

Result<std::shared_ptr<Endpoint>> EngineCore::NotificationEndpoint(const EngineDesc& peer) {
  Status last(Code::kUnavailable, "no transport carries notifications to " + peer.key);
  for (size_t i = 0; i < transports_.size(); ++i) {
    if (!transports_[i]->caps().notifications || !transports_[i]->CanReach(peer)) continue;
    auto endpoint = GetEndpoint(peer, i);
    if (endpoint.ok()) return endpoint;
    last = endpoint.status();
  }
  return last;
}

Result<std::shared_ptr<Endpoint>> EngineCore::NotifyEndpointFor(std::string_view peer_key) {
  std::shared_ptr<Endpoint> endpoint;
  uint64_t generation;
  {
    MutexLock lock(&mu_);
    auto it = notify_endpoints_.find(peer_key);
    if (it != notify_endpoints_.end() && it->second->healthy()) return it->second;
    generation = peers_generation_;
  }
  FERRY_ASSIGN_OR_RETURN(EngineDesc peer, FindPeer(peer_key));
  FERRY_ASSIGN_OR_RETURN(endpoint, NotificationEndpoint(peer));
  MutexLock lock(&mu_);
  // Not when the peer's descriptor changed meanwhile: the endpoint may be the old one's.
  if (generation == peers_generation_ && !closed()) notify_endpoints_[std::string(peer_key)] = endpoint;
  return endpoint;
}

Status EngineCore::Notify(std::string_view peer_key, std::string_view message, std::string_view topic) {
  const Clock::time_point start = Clock::now();
  Status s = NotifyUncounted(peer_key, message, topic);
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  metrics_->SeriesFor("notification", "", peer_key)->Record(s, message.size(), ns);
  return s;
}

Status EngineCore::NotifyUncounted(std::string_view peer_key, std::string_view message, std::string_view topic) {
  if (closed()) return Status(Code::kAborted, "the engine was shut down");
  if (!NeedsNotifyFrame(topic, message) && message.size() <= options_.max_notification_bytes) {
    // The default topic: the message's own bytes, without a copy.
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Endpoint> endpoint, NotifyEndpointFor(peer_key));
    return endpoint->Notify(message);
  }
  FERRY_ASSIGN_OR_RETURN(std::string wire, FrameNotification(options_, topic, message));
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Endpoint> endpoint, NotifyEndpointFor(peer_key));
  return endpoint->Notify(wire);
}

std::vector<Notification> EngineCore::PopNotifications(std::string_view topic) {
  std::vector<Notification> got = inbox_->PopAll(topic);
  if (!got.empty() || closed()) return got;
  bool progressed = false;
  for (const auto& t : transports_) progressed = t->Poll() || progressed;
  return progressed ? inbox_->PopAll(topic) : got;
}

Transfer EngineCore::Issue(std::shared_ptr<TransferState> state,
                          const std::function<void(const Status&)>& on_complete,
                          std::span<const Transfer> after, Series* series, uint64_t ops) {
  if (series) metrics_->Track(state, series, ops);
  if (on_complete) completions_->Attach(state, on_complete);
  // A transfer that others wait on through `after` finishes at its deadline even if nobody
  // waits on it, so that they fail with its error rather than later at their own.
  for (const Transfer& t : after)
    if (const auto& s = TransferAccess::Of(t)) completions_->Watch(s);
  return TransferAccess::Make(std::move(state));
}

Transfer EngineCore::NotifyAfter(std::string_view peer_key, std::string_view message,
                                 std::span<const Transfer> after, const TransferOptions& options) {
  const TransferId id = options.id ? *options.id : AllocateTransferId();
  Series* series = metrics_->SeriesFor("notification", "", peer_key);
  auto fail = [&](Status s) {
    return Issue(TransferState::Failed(std::move(s), id), options.on_complete, {}, series);
  };
  if (closed()) return fail(Status(Code::kAborted, "the engine was shut down"));
  if (options.notification || !options.after.empty())
    return fail(Status(Code::kInvalidArgument,
                       "NotifyAfter takes its message and its transfers as arguments, not in options"));
  if (options.deadline && *options.deadline <= Duration::zero())
    return fail(Status(Code::kInvalidArgument, "a transfer's deadline must be positive, not " +
                                                   std::to_string(options.deadline->count()) + " ns"));
  Result<std::string> wire = FrameNotification(options_, options.notification_topic, message);
  if (!wire.ok()) return fail(wire.status());
  std::vector<GateInput> inputs;
  for (size_t i = 0; i < after.size(); ++i) {
    const auto& s = TransferAccess::Of(after[i]);
    if (!s) return fail(Status(Code::kInvalidArgument, "after[" + std::to_string(i) + "] is an empty transfer handle"));
    inputs.push_back({s, "transfer " + std::to_string(static_cast<uint64_t>(s->id())) + " named in `after`"});
  }
  Result<std::shared_ptr<Endpoint>> endpoint = NotifyEndpointFor(peer_key);
  if (!endpoint.ok()) return fail(endpoint.status());

  const Duration deadline = options.deadline ? *options.deadline : options_.default_deadline;
  auto state = std::make_shared<TransferState>(id, 0, TransferPath{}, Deadline::After(deadline));
  InstallAfterGate(state, std::move(inputs), std::move(endpoint).value(), std::move(wire).value());
  state->PartDone(Status::Ok());  // nothing to post: the gate (or the notification) follows
  return Issue(std::move(state), options.on_complete, after, series);
}

}  // namespace internal

Status Engine::Notify(std::string_view peer_key, std::string_view message, std::string_view topic) {
  return core_->Notify(peer_key, message, topic);
}
Transfer Engine::NotifyAfter(std::string_view peer_key, std::string_view message,
                             std::span<const Transfer> after, const TransferOptions& options) {
  return core_->NotifyAfter(peer_key, message, after, options);
}
std::vector<Notification> Engine::PopNotifications(std::string_view topic) {
  return core_->PopNotifications(topic);
}

void Engine::WatchNotifications(std::string_view topic, std::function<void()> on_arrival) {
  core_->WatchNotifications(topic, std::move(on_arrival));
}

}  // namespace ferry
