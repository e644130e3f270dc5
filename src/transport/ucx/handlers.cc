// The `ucx` transport's receiving side: every active message is decoded and checked here
// before any byte of it lands in registered memory (see am_wire.h for the messages).
#include <cstring>

#include "base/log.h"
#include "base/tsan.h"
#include "transport/ucx/core.h"

namespace ferry::internal::ucx {

void Core::HandleCheck(Shard& s, const AmHeader& h) {
  Code refusal;
  auto region = FindRegion(s, h, &refusal);
  Code code = Code::kOk;
  if (!region) code = refusal;
  else if (!region->live()) code = Code::kFailedPrecondition;
  else if (reinterpret_cast<uint64_t>(region->base) != h.offset || region->size != h.size)
    code = Code::kInvalidArgument;
  s.SendAck(h.conn, h.lane, h.token, code, code == Code::kPermissionDenied ? h.region : 0);
}

namespace {
struct RevokeCtx {
  Shard* shard;
  uint64_t conn;
  uint64_t token;
  int left;
};

void FinishRevoke(RevokeCtx* c) {
  if (--c->left != 0) return;
  auto it = c->shard->conn_by_id.find(c->conn);
  if (it != c->shard->conn_by_id.end()) c->shard->SendAckOn(*it->second, c->token, Code::kOk);
  delete c;
}
}  // namespace

// On the initiator: the target of connection h.conn deregisters a region.
void Core::HandleRevoke(Shard& s, const AmHeader& h) {
  auto it = s.conn_by_id.find(h.conn);
  // A connection this engine closed meanwhile: the target forgets it when its socket closes.
  if (it == s.conn_by_id.end()) return;
  Conn* conn = it->second;
  conn->Revoke(h.region);
  // Ack once every lane's RMA has completed at the target.
  auto* ctx = new RevokeCtx{&s, h.conn, h.token, static_cast<int>(conn->lanes()) + 1};
  for (size_t lane = 0; lane < conn->lanes(); ++lane) {
    ucp_request_param_t p = {};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = [](void* request, ucs_status_t, void* user_data) {
      FinishRevoke(static_cast<RevokeCtx*>(user_data));
      ucp_request_free(request);
    };
    p.user_data = ctx;
    void* req = ucp_ep_flush_nbx(conn->ep(lane), &p);
    if (!UCS_PTR_IS_PTR(req)) FinishRevoke(ctx);
  }
  FinishRevoke(ctx);
}

ucs_status_t Core::OnMessage(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param) {
  auto* shard = static_cast<Shard*>(arg);
  Core* core = shard->core;
  FERRY_TSAN_WIRE_ACQUIRE();
  auto decoded = DecodeHeader(header, header_length, length);
  if (!decoded.ok()) {
    core->Reject(std::string(decoded.status().message()).c_str());
    return UCS_OK;  // drops the payload (a rendezvous send completes on the sender's side)
  }
  const AmHeader& h = *decoded;
  bool keep = false;
  switch (h.type) {
    // Answers, on this engine's own connections: the token names the operation, and it must
    // have gone out on the connection the answer names.
    case MsgType::kReadResp:
      core->HandleReadResp(*shard, h, data, param, &keep);
      return keep ? UCS_INPROGRESS : UCS_OK;
    case MsgType::kAck:
      core->HandleAck(*shard, h);
      return UCS_OK;
    case MsgType::kRevoke:
      core->HandleRevoke(*shard, h);
      return UCS_OK;
    default:
      break;
  }
  // Requests, from connections that peers made here: the connection, named by the id this
  // engine gave it in the handshake, says who sent them.
  Accepted* from = shard->FindAccepted(h.conn);
  if (from == nullptr) {
    core->Reject("a request on no connection of this engine");
    return UCS_OK;  // drops the payload (a rendezvous send completes on the sender's side)
  }
  switch (h.type) {
    case MsgType::kWrite:
      core->HandleWrite(*shard, h, data, param, &keep);
      break;
    case MsgType::kReadReq:
      core->HandleReadReq(*shard, h);
      break;
    case MsgType::kNotify:
      if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        core->Reject("notification sent by rendezvous");
        return UCS_OK;
      }
      core->HandleNotify(*shard, *from, h, data, length);
      break;
    case MsgType::kCheck:
      core->HandleCheck(*shard, h);
      break;
    case MsgType::kStagedWrite:
      core->stager_->HandleWrite(*shard, h, data, length, param, &keep);
      break;
    case MsgType::kStagedReadReq:
      core->stager_->HandleReadReq(*shard, h, data, length, param);
      break;
    default:
      break;
  }
  return keep ? UCS_INPROGRESS : UCS_OK;
}

namespace {

// A payload being received straight into registered memory.
struct RecvCtx {
  Shard* shard;
  std::shared_ptr<RegionUse> hold;
  uint64_t token = 0;
  std::shared_ptr<TransferState> state;  // read responses: the waiting transfer
  std::function<void(Status)> done;
};

void OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data) {
  auto* ctx = static_cast<RecvCtx*>(user_data);
  FERRY_TSAN_WIRE_ACQUIRE();  // the payload was written by UCX (possibly another process)
  ctx->done(FromUcs(status, "receiving a payload"));
  delete ctx;
  ucp_request_free(request);
}

// Receives `size` bytes of a message into `dst`: copied at once for eager data, or through
// ucp_am_recv_data_nbx for a rendezvous. Returns whether UCX keeps the descriptor.
bool Receive(ucp_worker_h worker, void* data, const ucp_am_recv_param_t* param, std::byte* dst,
             uint64_t size, RecvCtx* ctx) {
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    if (size > 0) std::memcpy(dst, data, size);
    ctx->done(Status::Ok());
    delete ctx;
    return false;
  }
  ucp_request_param_t p = {};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &OnRecvDone;
  p.user_data = ctx;
  void* req = ucp_am_recv_data_nbx(worker, data, dst, size, &p);
  if (UCS_PTR_IS_ERR(req)) {
    ctx->done(FromUcs(UCS_PTR_STATUS(req), "ucp_am_recv_data_nbx"));
    delete ctx;
  } else if (req == nullptr) {
    ctx->done(Status::Ok());
    delete ctx;
  }
  return true;
}

}  // namespace

void Core::HandleWrite(Shard& s, const AmHeader& h, void* data, const ucp_am_recv_param_t* param, bool* keep) {
  Code refusal;
  auto region = FindRegion(s, h, &refusal);
  if (!region) {
    if (refusal == Code::kPermissionDenied) return s.SendAck(h.conn, h.lane, h.token, refusal, h.region);
    Reject("write to an unknown region");
    return s.SendAck(h.conn, h.lane, h.token, Code::kFailedPrecondition);
  }
  if (!InBounds(h.offset, h.size, region->size)) {
    Reject("write out of a region's bounds");
    return s.SendAck(h.conn, h.lane, h.token, Code::kOutOfRange);
  }
  if (region->kind != MemoryKind::kHost) {  // GPU memory: only staged messages reach it
    Reject("plain write to GPU memory");
    return s.SendAck(h.conn, h.lane, h.token, Code::kUnsupported);
  }
  auto hold = RegionUse::Make(region);
  if (!hold) return s.SendAck(h.conn, h.lane, h.token, Code::kFailedPrecondition);
  auto* ctx = new RecvCtx{&s, hold, h.token, nullptr, nullptr};
  // A rendezvous lands later, whatever happens to the connection meanwhile: counted, so that a
  // fence (FencePeer) can wait for it.
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (rndv) ++s.receiving[h.conn];
  ctx->done = [shard = &s, conn = h.conn, lane = h.lane, token = h.token, rndv](Status st) {
    if (rndv) shard->EndReceive(conn);
    shard->SendAck(conn, lane, token, st.code());
  };
  *keep = Receive(s.worker->handle(), data, param, region->base + h.offset, h.size, ctx);
}

void Core::HandleReadReq(Shard& s, const AmHeader& h) {
  Code refusal;
  auto region = FindRegion(s, h, &refusal);
  if (!region && refusal == Code::kPermissionDenied) return s.SendAck(h.conn, h.lane, h.token, refusal, h.region);
  Code code = Code::kOk;
  if (!region) code = Code::kFailedPrecondition;
  else if (!InBounds(h.offset, h.size, region->size)) code = Code::kOutOfRange;
  else if (region->kind != MemoryKind::kHost) code = Code::kUnsupported;  // staged reads only
  auto hold = code == Code::kOk ? RegionUse::Make(region) : nullptr;
  if (code == Code::kOk && !hold) code = Code::kFailedPrecondition;
  if (code != Code::kOk) {
    Reject(code == Code::kUnsupported ? "plain read of GPU memory" : "read outside the registered regions");
    return s.SendAck(h.conn, h.lane, h.token, code);
  }
  AmHeader resp;
  resp.type = MsgType::kReadResp;
  resp.token = h.token;
  resp.conn = h.conn;
  resp.lane = h.lane;
  resp.size = h.size;
  // The payload is sent from the region itself, held until the send completes.
  s.Send(s.ReplyEp(h.conn, h.lane), resp, region->base + h.offset, {}, /*eager=*/false, std::move(hold));
}

void Core::HandleReadResp(Shard& s, const AmHeader& h, void* data, const ucp_am_recv_param_t* param, bool* keep) {
  auto it = s.pending.find(h.token);
  if (it == s.pending.end()) return;  // its transfer already ended; drop the late answer
  if (it->second.conn == nullptr || it->second.conn->id() != h.conn) return Reject("a read response from another connection");
  Pending p = std::move(it->second);
  s.pending.erase(it);
  if (h.size != p.size) {
    Reject("read response of the wrong size");
    p.state->PartDone(Status(Code::kDataLoss, "read response of the wrong size"));
    return;
  }
  auto* ctx = new RecvCtx{&s, nullptr, h.token, p.state, nullptr};
  if (p.on_data) ctx->done = std::move(p.on_data);  // a staged read scatters the chunk first
  else ctx->done = [state = p.state](Status st) { state->PartDone(st); };
  *keep = Receive(s.worker->handle(), data, param, p.dst, p.size, ctx);
}

void Core::HandleAck(Shard& s, const AmHeader& h) {
  auto it = s.pending.find(h.token);
  if (it == s.pending.end()) return;
  const uint64_t sent_on = it->second.conn != nullptr ? it->second.conn->id() : it->second.accepted;
  if (sent_on != h.conn) return Reject("an ack from another connection");
  if (it->second.conn != nullptr) it->second.conn->MarkAnswered();
  Status st;
  switch (static_cast<Code>(h.code)) {
    case Code::kOk: break;
    case Code::kOutOfRange: st = Status(Code::kOutOfRange, "the target rejected an out-of-range access"); break;
    case Code::kFailedPrecondition: st = Status(Code::kFailedPrecondition, "the target region is not registered"); break;
    case Code::kResourceExhausted:
      // The only two answers of this code: a notification refused, a staged chunk without a buffer.
      st = Status(Code::kResourceExhausted, "the receiver's notification backlog is full, or all its staged receive buffers are in use");
      break;
    case Code::kInvalidArgument: st = Status(Code::kInvalidArgument, "the receiver rejected the notification"); break;
    case Code::kUnsupported: st = Status(Code::kUnsupported, "the target cannot take this access to that region"); break;
    case Code::kPermissionDenied:
      st = Status(Code::kPermissionDenied, "the target's access list for region " + std::to_string(h.region) +
                                               " does not name this engine");
      break;
    default: st = Status(static_cast<Code>(h.code), "the target failed the operation"); break;
  }
  it->second.state->PartDone(st);
  s.pending.erase(it);
}

// A notification with a token (one carried by a write batch) is acked, so that the batch
// completes once the receiver holds it; one without (Endpoint::Notify) is one-way: a refusal
// is counted by the inbox and logged here. The sender is the engine that made the connection.
void Core::HandleNotify(Shard& s, const Accepted& from, const AmHeader& h, const void* data, size_t length) {
  auto message = DecodeNotify(h, data, length);
  if (!message.ok()) {
    Reject(std::string(message.status().message()).c_str());
    if (h.token != 0) s.SendAck(h.conn, h.lane, h.token, message.status().code());
    return;
  }
  Notification n;
  n.from = from.peer_key;
  n.message.assign(*message);
  Status st = inbox_->Push(std::move(n));
  if (h.token != 0) return s.SendAck(h.conn, h.lane, h.token, st.code());
  if (!st.ok()) {
    // A sender that floods a full inbox must not flood the log: the first few, then every 1000th.
    uint64_t dropped = inbox_->dropped();
    if (dropped <= 8 || dropped % 1000 == 0)
      FERRY_LOG_WARN("ucx: dropped notification #{} from {}: {}", dropped, from.peer_key, st.ToString());
  }
}

}  // namespace ferry::internal::ucx
