// UcxRawClient: a raw UCX client that completes ferry's door handshake (door_wire.h) under a
// key of its own, then sends hand-made active messages (am_wire.h) and collects the acks, to
// play a peer that skips the engine's own checks (e.g. the kCheck of OpenSession). Tests that
// link it link UCX (the system's headers).
//
// Thread safety: one test thread.
#pragma once

#include <gtest/gtest.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "transport/ucx/am_wire.h"
#include "transport/ucx/door.h"

namespace ferry::testing {

class UcxRawClient {
 public:
  // Connects to the engine at `address` (its door) as engine `from`, for engine `to`, proving
  // `secret` when it is not empty.
  UcxRawClient(const std::string& address, const std::string& from, const std::string& to,
               const std::string& secret = {}) {
    ucp_params_t params = {};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    EXPECT_EQ(ucp_init(&params, nullptr, &context_), UCS_OK);
    ucp_worker_params_t wp = {};
    EXPECT_EQ(ucp_worker_create(context_, &wp, &worker_), UCS_OK);
    ucp_am_handler_param_t am = {};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = internal::ucx::kAmId;
    am.arg = this;
    am.cb = [](void* arg, const void* header, size_t length, void*, size_t payload, const ucp_am_recv_param_t*) {
      auto h = internal::ucx::DecodeHeader(header, length, payload);
      auto* self = static_cast<UcxRawClient*>(arg);
      if (h.ok() && h->type == internal::ucx::MsgType::kAck) self->acks_.push_back(*h);
      if (h.ok() && h->type == internal::ucx::MsgType::kReadResp) self->read_responses_ += 1;
      return UCS_OK;
    };
    EXPECT_EQ(ucp_worker_set_am_recv_handler(worker_, &am), UCS_OK);
    ucp_address_t* mine = nullptr;
    size_t mine_len = 0;
    EXPECT_EQ(ucp_worker_get_address(worker_, &mine, &mine_len), UCS_OK);
    internal::ucx::Hello hello{from, to, 1, std::string(reinterpret_cast<const char*>(mine), mine_len)};
    ucp_worker_release_address(worker_, mine);
    auto d = internal::ucx::Dial(address, hello, Deadline::After(std::chrono::seconds(5)), secret);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    if (!d.ok()) return;
    control_ = d->control;
    conn_ = d->welcome.conn_id;
    ucp_ep_params_t ep = {};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.address = reinterpret_cast<const ucp_address_t*>(d->welcome.worker_address.data());
    EXPECT_EQ(ucp_ep_create(worker_, &ep, &ep_), UCS_OK);
  }
  ~UcxRawClient() {
    if (ep_ != nullptr) {
      ucp_request_param_t p = {};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* req = ucp_ep_close_nbx(ep_, &p);
      if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
    }
    if (control_ >= 0) close(control_);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }
  UcxRawClient(const UcxRawClient&) = delete;
  UcxRawClient& operator=(const UcxRawClient&) = delete;

  // The id the target gave the connection (0: the handshake failed).
  uint64_t conn() const { return conn_; }
  const std::vector<internal::ucx::AmHeader>& acks() const { return acks_; }
  int read_responses() const { return read_responses_; }

  // Sends `h` (its conn set to this connection's) with `len` bytes of `data`, and waits until
  // UCX has sent it.
  void Send(internal::ucx::AmHeader h, const void* data, size_t len) {
    h.conn = conn_;
    uint8_t raw[internal::ucx::kAmHeaderBytes];
    internal::ucx::EncodeHeader(h, raw);
    ucp_request_param_t p = {};
    void* req = ucp_am_send_nbx(ep_, internal::ucx::kAmId, raw, sizeof(raw), data, len, &p);
    while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker_);
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
  }
  // Progresses until `n` acks came, or `timeout`.
  void WaitAcks(size_t n, std::chrono::milliseconds timeout) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (acks_.size() < n && std::chrono::steady_clock::now() < until) ucp_worker_progress(worker_);
  }

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  int control_ = -1;
  uint64_t conn_ = 0;
  std::vector<internal::ucx::AmHeader> acks_;
  int read_responses_ = 0;
};

}  // namespace ferry::testing
