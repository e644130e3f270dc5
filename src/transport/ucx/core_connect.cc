// Core's connections (core.h): the door's admission of a peer's connection (the endpoints
// back to its worker, on shard 0), their end, and the dialling of a peer.
#include <unistd.h>

#include <thread>

#include "base/log.h"
#include "base/mutex.h"
#include "transport/ucx/core.h"

namespace ferry::internal::ucx {

// The door thread waits for shard 0 to open the endpoints, so that the initiator's first
// message finds its connection. If the wait ends first, the connection is dropped.
// UCX takes a worker address without its length and trusts what it says: an address of another
// UCX version or format (its first byte) crashed UCX 1.13's parser in most random cases. Such
// addresses are refused; the rest go to UCX with zeros after them, so no read past their end
// leaves the buffer. (A crafted address of the right format can still upset UCX's parser; only
// authenticated peers close that.)
Result<std::string> Core::CheckedWorkerAddress(std::string_view address) const {
  const std::string& own = shards_[0]->worker_address;
  if (address.empty() || own.empty() || address[0] != own[0])
    return Status(Code::kInvalidArgument, "the peer's UCX worker address is of another UCX version or format");
  std::string padded(address);
  padded.resize(address.size() + 4096, '\0');
  return padded;
}

Welcome Core::Admit(const Hello& hello, Deadline deadline) {
  auto address = CheckedWorkerAddress(hello.worker_address);
  if (!address.ok()) {
    Welcome w;
    w.code = address.status().code();
    w.message = std::string(address.status().message());
    return w;
  }
  struct Wait {
    Mutex mu;
    CondVar cv;
    bool done GUARDED_BY(mu) = false;
    bool abandoned GUARDED_BY(mu) = false;
    Status status GUARDED_BY(mu);
  };
  auto wait = std::make_shared<Wait>();
  const uint64_t id = RandomKey();  // unguessable: it is what names the peer in each message
  Shard* s0 = shards_[0].get();
  bool submitted = s0->worker->Submit([this, s0, wait, id, hello, padded = std::move(address).value()] {
    MutexLock lock(&wait->mu);
    if (wait->abandoned) return;
    if (s0->accepted.count(id) != 0) {  // 2^-64
      wait->status = Status(Code::kUnavailable, "connection id in use; retry");
      wait->done = true;
      return wait->cv.NotifyAll();
    }
    auto a = std::make_unique<Accepted>();
    a->id = id;
    a->peer_key = hello.from_key;
    Status st;
    for (int i = 0; i < hello.lanes && st.ok(); ++i) {
      auto ep = OpenEndpoint(s0->worker->handle(), padded, &Core::OnAcceptedError, this);
      if (!ep.ok()) {
        st = ep.status().WithContext("opening an endpoint back to " + hello.from_key);
        break;
      }
      a->eps.push_back(*ep);
      s0->accepted_by_ep[*ep] = id;
    }
    if (!st.ok()) {
      for (ucp_ep_h ep : a->eps) {
        s0->accepted_by_ep.erase(ep);
        CloseEndpoint(ep);
      }
    } else {
      s0->accepted[id] = std::move(a);
    }
    wait->status = st;
    wait->done = true;
    wait->cv.NotifyAll();
  });
  Welcome w;
  if (!submitted) {
    w.code = Code::kUnavailable;
    w.message = "the engine is shutting down";
    return w;
  }
  MutexLock lock(&wait->mu);
  if (!wait->cv.WaitUntil(&wait->mu, deadline.at(), [&]() REQUIRES(wait->mu) { return wait->done; })) {
    wait->abandoned = true;
    w.code = Code::kUnavailable;
    w.message = "the engine is too busy to take a connection";
    return w;
  }
  if (!wait->status.ok()) {
    w.code = wait->status.code();
    w.message = std::string(wait->status.message());
    return w;
  }
  w.conn_id = id;
  w.worker_address = s0->worker_address;
  return w;
}

void Core::DropAccepted(uint64_t id, const Status& why) {
  Shard& s0 = *shards_[0];
  auto it = s0.accepted.find(id);
  if (it == s0.accepted.end()) return;
  std::unique_ptr<Accepted> a = std::move(it->second);
  s0.accepted.erase(it);
  FERRY_LOG_DEBUG("ucx: connection from {} ended: {}", a->peer_key, why.ToString());
  s0.FailPending(nullptr, id, why);
  for (ucp_ep_h ep : a->eps) {
    s0.accepted_by_ep.erase(ep);
    CloseEndpoint(ep);
  }
}

Status Core::FencePeer(const std::string& key, Deadline deadline) {
  struct Probe {
    Mutex mu;
    CondVar cv;
    bool done GUARDED_BY(mu) = false;
    uint64_t landing GUARDED_BY(mu) = 0;
  };
  Shard* s0 = shards_[0].get();
  // The ids of the connections dropped: touched on shard 0's thread only.
  auto dropped = std::make_shared<std::vector<uint64_t>>();
  for (bool first = true;; first = false) {
    auto probe = std::make_shared<Probe>();
    bool submitted = s0->worker->Submit([this, s0, dropped, probe, key, first] {
      if (first) {
        for (const auto& [id, a] : s0->accepted)
          if (a->peer_key == key) dropped->push_back(id);
        for (uint64_t id : *dropped) {
          DropAccepted(id, Status(Code::kAborted, "peer " + key + " was fenced"));
          if (door_) door_->Forget(id);  // its initiator sees the socket close (Conn::TargetClosed)
        }
      }
      uint64_t landing = 0;
      for (uint64_t id : *dropped)
        if (auto it = s0->receiving.find(id); it != s0->receiving.end()) landing += it->second;
      MutexLock lock(&probe->mu);
      probe->landing = landing;
      probe->done = true;
      probe->cv.NotifyAll();
    });
    if (!submitted) return Status(Code::kAborted, "the ucx transport was shut down");
    uint64_t landing = 0;
    {
      MutexLock lock(&probe->mu);
      if (!probe->cv.WaitUntil(&probe->mu, deadline.at(), [&]() REQUIRES(probe->mu) { return probe->done; }))
        return Status(Code::kDeadlineExceeded, "fencing " + key + ": the ucx worker did not get to it in time");
      landing = probe->landing;
    }
    if (landing == 0) {
      if (!dropped->empty() || first) FERRY_LOG_INFO("ucx: fenced {} ({} connection(s) dropped)", key, dropped->size());
      return Status::Ok();
    }
    if (deadline.expired())
      return Status(Code::kDeadlineExceeded, "fencing " + key + ": " + std::to_string(landing) +
                                                 " of its writes are still landing (a stalled link); call again later");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Core::OnAcceptedError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* core = static_cast<Core*>(arg);
  Shard& s0 = *core->shards_[0];
  auto it = s0.accepted_by_ep.find(ep);
  if (it == s0.accepted_by_ep.end()) return;
  const uint64_t id = it->second;
  core->DropAccepted(id, FromUcs(status, "a peer's connection failed"));
  if (core->door_) core->door_->Forget(id);
}

Result<std::shared_ptr<Conn>> Core::Dial(const EngineDesc& peer, const std::string& peer_address, bool same_host,
                                         size_t shard_index, int lanes, Deadline deadline) {
  Shard& shard = this->shard(shard_index);
  Hello hello;
  hello.from_key = engine_key_;
  hello.to_key = peer.key;
  hello.lanes = static_cast<uint16_t>(lanes);
  hello.worker_address = shard.worker_address;
  FERRY_ASSIGN_OR_RETURN(Dialed d, ucx::Dial(peer_address, hello, deadline, secret_));
  auto address = CheckedWorkerAddress(d.welcome.worker_address);
  if (!address.ok()) {
    close(d.control);
    return address.status().WithContext("engine at " + peer_address);
  }
  if (d.welcome.key != peer.key) {
    close(d.control);
    return Status(Code::kFailedPrecondition, "the engine at " + peer_address + " is '" + d.welcome.key + "', not '" +
                                                 peer.key + "' as its descriptor says");
  }
  auto conn = std::make_shared<Conn>(shared_from_this(), &shard, peer, peer_address, same_host, d.welcome.conn_id,
                                     std::move(address).value(), d.control);
  bool ok = shard.worker->Submit([conn, lanes] {
    Status s = conn->Open(lanes);
    if (!s.ok()) return conn->Fail(s);
    conn->shard().conns.insert(conn);
  });
  if (!ok) return Status(Code::kAborted, "the ucx transport was shut down");
  return conn;
}

}  // namespace ferry::internal::ucx
