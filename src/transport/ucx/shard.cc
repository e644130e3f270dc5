// Sending on a shard (core.h): active messages with their payloads held until UCX is done,
// acks, the table of operations waiting for an answer and the tokens that name them, and
// Core::Call (a request and its ack, from a user thread).
#include <random>

#include "base/tsan.h"
#include "transport/ucx/core.h"

namespace ferry::internal::ucx {
namespace {

// A heap-held send: the header and payload stay valid until UCX completes the send.
struct SendCtx {
  uint8_t header[kAmHeaderBytes];
  std::string payload;
  std::shared_ptr<void> hold;  // source region of a read response, or a bounce buffer
  uint64_t* in_flight = nullptr;    // Shard::sends_in_flight
};

void OnSendDone(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<SendCtx*>(user_data);
  --*ctx->in_flight;
  delete ctx;
  ucp_request_free(request);
}

}  // namespace

void Shard::Send(ucp_ep_h ep, const AmHeader& h, const void* data, std::string payload, bool eager,
                 std::shared_ptr<void> hold) {
  if (ep == nullptr) return;  // an accepted connection that is gone: nobody waits for the answer
  auto* ctx = new SendCtx();
  EncodeHeader(h, ctx->header);
  ctx->payload = std::move(payload);
  ctx->hold = std::move(hold);
  const void* buffer = data != nullptr ? data : ctx->payload.data();
  size_t size = data != nullptr ? h.size : ctx->payload.size();
  ucp_request_param_t p = {};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &OnSendDone;
  p.user_data = ctx;
  // Answers go back on the endpoints the target opened to this worker (Accepted), found by the
  // connection id in the header: no reply endpoint travels.
  p.flags = eager ? UCP_AM_SEND_FLAG_EAGER : 0;
  ctx->in_flight = &sends_in_flight;
  FERRY_TSAN_WIRE_RELEASE();
  void* req = ucp_am_send_nbx(ep, kAmId, ctx->header, kAmHeaderBytes, buffer, size, &p);
  if (UCS_PTR_IS_PTR(req)) ++sends_in_flight;
  else delete ctx;  // done at once, or failed (the peer's error handler reports it)
}

void Shard::SendAck(uint64_t conn, uint8_t lane, uint64_t token, Code code, uint64_t region) {
  ucp_ep_h ep = ReplyEp(conn, lane);
  if (ep == nullptr) return;  // the connection is gone; so is whoever waited for the answer
  AmHeader h;
  h.type = MsgType::kAck;
  h.token = token;
  h.region = region;
  h.conn = conn;
  h.lane = lane;
  h.code = static_cast<uint8_t>(code);
  Send(ep, h, nullptr, std::string());
}

void Shard::SendAckOn(const Conn& conn, uint64_t token, Code code) {
  if (conn.failed()) return;
  AmHeader h;
  h.type = MsgType::kAck;
  h.token = token;
  h.conn = conn.id();
  h.code = static_cast<uint8_t>(code);
  Send(conn.ep(0), h, nullptr, std::string());
}

TokenSource::TokenSource() {
  std::random_device rd;
  key_ = (uint64_t{rd()} << 32) ^ rd();
}

uint64_t TokenSource::Next() {
  for (;;) {
    // The splitmix64 finalizer: a bijection of 64-bit words.
    uint64_t z = ++counter_ ^ key_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    if (z != 0) return z;
  }
}

uint64_t Shard::AddPending(Pending p) {
  uint64_t token = tokens.Next();
  pending.emplace(token, std::move(p));
  return token;
}

void Shard::FailPending(const Conn* conn, uint64_t accepted_id, const Status& why) {
  for (auto it = pending.begin(); it != pending.end();) {
    if ((conn != nullptr && it->second.conn == conn) ||
        (accepted_id != 0 && it->second.accepted == accepted_id)) {
      it->second.state->PartDone(why);
      it = pending.erase(it);
    } else {
      ++it;
    }
  }
}

uint64_t RandomKey() {
  std::random_device rd;
  for (;;) {
    uint64_t k = (uint64_t{rd()} << 32) ^ rd();
    if (k != 0) return k;
  }
}

Status Core::Call(const std::shared_ptr<Conn>& conn, AmHeader h, std::string payload, Deadline deadline) {
  auto state = std::make_shared<TransferState>(TransferId{}, 0, TransferPath{"ucx", false}, deadline);
  state->AddParts(1);
  Shard& s = conn->shard();
  bool ok = s.worker->Submit([&s, conn, state, h, payload = std::move(payload)]() mutable {
    if (conn->failed()) return state->PartDone(conn->failure());
    h.conn = conn->id();
    h.lane = 0;
    h.token = s.AddPending(Pending{state, conn.get(), 0});
    s.Send(conn->ep(0), h, nullptr, std::move(payload), /*eager=*/true);
  });
  if (!ok) return Status(Code::kAborted, "the ucx transport was shut down");
  state->PartDone(Status::Ok());
  return state->Wait(Deadline());
}

}  // namespace ferry::internal::ucx
