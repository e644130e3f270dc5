// The target side of the staged path (staged.h): chunks received into bounce buffers and
// scattered into regions, and pieces gathered for reads.
#include <cstring>

#include "base/log.h"
#include "base/tsan.h"
#include "transport/ucx/staged_internal.h"

namespace ferry::internal::ucx {

// ---- Target ----------------------------------------------------------------------------------

namespace {
struct StagedRecv {
  std::shared_ptr<Stager::Impl> stager;
  Shard* shard;
  std::shared_ptr<RegionUse> hold;
  std::shared_ptr<Bounce> buf;
  size_t length;
  Reply reply;
  uint64_t token;
};

void OnStagedRecv(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* ctx = static_cast<StagedRecv*>(user_data);
  FERRY_TSAN_WIRE_ACQUIRE();
  if (status != UCS_OK) ctx->stager->SendAckIfOpen(*ctx->shard, ctx->reply, ctx->token, FromUcs(status, "receive").code());
  else ctx->stager->Scatter(*ctx->shard, ctx->hold, ctx->buf, ctx->length, ctx->reply, ctx->token);
  delete ctx;
  ucp_request_free(request);
}
}  // namespace

void Stager::HandleWrite(Shard& s, const AmHeader& h, void* data, size_t length, const ucp_am_recv_param_t* param,
                         bool* keep) {
  Core& core = *impl_->core;
  Reply reply = Reply{h.conn, h.lane};
  Code refusal;
  auto region = core.FindRegion(s, h, &refusal);
  if (!region && refusal == Code::kPermissionDenied) return s.SendAck(reply.conn, reply.lane, h.token, refusal, h.region);
  auto hold = region ? RegionUse::Make(region) : nullptr;
  if (!hold) {
    core.Reject("staged write to an unknown region");
    return s.SendAck(reply.conn, reply.lane, h.token, Code::kFailedPrecondition);
  }
  if (length > kBounceBytes) {
    core.Reject("staged chunk larger than a bounce buffer");
    return s.SendAck(reply.conn, reply.lane, h.token, Code::kInvalidArgument);
  }
  if (region->kind == MemoryKind::kCuda && !impl_->gpu()) return s.SendAck(reply.conn, reply.lane, h.token, Code::kUnsupported);
  auto buf = AnyBuffer(region->kind == MemoryKind::kCuda ? impl_->recv_pool.get() : nullptr, impl_->heap);
  if (!buf) return s.SendAck(reply.conn, reply.lane, h.token, Code::kResourceExhausted);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
    std::memcpy(buf->data, data, length);
    return impl_->Scatter(s, hold, std::move(buf), length, reply, h.token);
  }
  auto* ctx = new StagedRecv{impl_, &s, hold, buf, length, reply, h.token};
  ucp_request_param_t p = {};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &OnStagedRecv;
  p.user_data = ctx;
  void* req = ucp_am_recv_data_nbx(s.worker->handle(), data, buf->data, length, &p);
  *keep = true;
  if (UCS_PTR_IS_ERR(req)) {
    impl_->SendAckIfOpen(s, reply, h.token, FromUcs(UCS_PTR_STATUS(req), "ucp_am_recv_data_nbx").code());
    delete ctx;
  } else if (req == nullptr) {
    impl_->Scatter(s, hold, buf, length, reply, h.token);
    delete ctx;
  }
}

void Stager::Impl::Scatter(Shard& s, const std::shared_ptr<RegionUse>& hold, std::shared_ptr<Bounce> buf,
                           size_t length, Reply reply, uint64_t token) {
  // The connection was dropped while the chunk was on its way (a fence, or the peer left):
  // its writes are refused, and no answer can go back.
  if (s.FindAccepted(reply.conn) == nullptr) return core->Reject("a staged write on a connection that was dropped");
  Region& region = hold->region();
  auto chunk = DecodeStagedWrite(buf->data, length, region.size);
  if (!chunk.ok()) {
    core->Reject(std::string(chunk.status().message()).c_str());
    return SendAckIfOpen(s, reply, token, chunk.status().code());
  }
  const std::vector<StagedPiece>& pieces = chunk->pieces;
  const std::byte* at = buf->data + chunk->data_offset;
  if (region.kind == MemoryKind::kHost) {
    for (const StagedPiece& p : pieces) {
      std::memcpy(region.base + p.offset, at, p.size);
      at += p.size;
    }
    return SendAckIfOpen(s, reply, token, Code::kOk);
  }
  std::vector<GpuCopy> copies;
  copies.reserve(pieces.size());
  for (const StagedPiece& p : pieces) {
    copies.push_back({region.base + p.offset, at, p.size});
    at += p.size;
  }
  // The ack leaves once the bytes are in GPU memory.
  auto self = shared_from_this();
  const size_t shard = s.index;
  Status posted = Copy(region.device, copies, buf->pinned, [self, hold, buf, reply, token, shard](const Status& st) {
    (void)self->dispatch->Run(shard, [self, reply, token, shard, code = st.code()] {
      self->SendAckIfOpen(self->core->shard(shard), reply, token, code);
    });
  });
  if (!posted.ok()) SendAckIfOpen(s, reply, token, posted.code());
}

void Stager::HandleReadReq(Shard& s, const AmHeader& h, const void* data, size_t length,
                           const ucp_am_recv_param_t* param) {
  Core& core = *impl_->core;
  Reply reply = Reply{h.conn, h.lane};
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    core.Reject("staged read request sent by rendezvous");
    return s.SendAck(reply.conn, reply.lane, h.token, Code::kInvalidArgument);
  }
  Code refusal;
  auto region = core.FindRegion(s, h, &refusal);
  if (!region && refusal == Code::kPermissionDenied) return s.SendAck(reply.conn, reply.lane, h.token, refusal, h.region);
  auto hold = region ? RegionUse::Make(region) : nullptr;
  if (!hold) {
    core.Reject("staged read of an unknown region");
    return s.SendAck(reply.conn, reply.lane, h.token, Code::kFailedPrecondition);
  }
  auto pieces = DecodeStagedReadReq(static_cast<const std::byte*>(data), length, h.offset, region->size);
  if (!pieces.ok()) {
    core.Reject(std::string(pieces.status().message()).c_str());
    return s.SendAck(reply.conn, reply.lane, h.token, pieces.status().code());
  }
  if (region->kind == MemoryKind::kCuda && !impl_->gpu()) return s.SendAck(reply.conn, reply.lane, h.token, Code::kUnsupported);
  impl_->Gather(s, hold, std::move(pieces).value(), h.offset, reply, h.token);
}

void Stager::Impl::Gather(Shard& s, const std::shared_ptr<RegionUse>& hold, std::vector<StagedPiece> pieces,
                          uint64_t total, Reply reply, uint64_t token) {
  Region& region = hold->region();
  AmHeader resp;
  resp.type = MsgType::kReadResp;
  resp.token = token;
  resp.conn = reply.conn;
  resp.lane = reply.lane;
  resp.size = total;
  if (region.kind == MemoryKind::kHost) {
    std::string payload;
    payload.reserve(total);
    for (const StagedPiece& p : pieces) payload.append(reinterpret_cast<const char*>(region.base + p.offset), p.size);
    return s.Send(s.ReplyEp(reply.conn, reply.lane), resp, nullptr, std::move(payload));
  }
  auto buf = AnyBuffer(send_pool.get(), heap);
  if (!buf) return SendAckIfOpen(s, reply, token, Code::kResourceExhausted);
  std::vector<GpuCopy> copies;
  copies.reserve(pieces.size());
  std::byte* at = buf->data;
  for (const StagedPiece& p : pieces) {
    copies.push_back({at, region.base + p.offset, p.size});
    at += p.size;
  }
  auto self = shared_from_this();
  const size_t shard = s.index;
  Status posted = Copy(region.device, copies, buf->pinned, [self, hold, buf, reply, token, resp, shard](const Status& st) {
    (void)self->dispatch->Run(shard, [self, buf, reply, token, resp, st, shard] {
      Shard& sh = self->core->shard(shard);
      if (!st.ok()) return self->SendAckIfOpen(sh, reply, token, st.code());
      if (ucp_ep_h ep = sh.ReplyEp(reply.conn, reply.lane)) sh.Send(ep, resp, buf->data, {}, false, buf);
    });
  });
  if (!posted.ok()) SendAckIfOpen(s, reply, token, posted.code());
}
}  // namespace ferry::internal::ucx
