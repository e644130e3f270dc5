#include "link.h"

#include <fmt/format.h>

#include "buffers.h"

namespace ferry::tools {
namespace {

class InProcessLink final : public Link {
 public:
  const Session& session() const override { return session_; }
  uint64_t bytes() const override { return bytes_; }
  std::string Describe() const override {
    return fmt::format("in-process, {0} -> {0}, {1}, copy threads {2}", MemoryKindName(kind_),
                       session_.path().ToString(),
                       copy_threads_ == 0 ? "auto" : std::to_string(copy_threads_));
  }

  ~InProcessLink() override {
    // Deregistering waits for transfers still using the buffers; a buffer that a late copy may
    // still touch is leaked rather than freed. Then the engines go, before the buffers.
    session_ = Session();
    if (local_desc_.size != 0) DeregisterAndFree(*local_engine_, local_desc_, local_buffer_);
    if (remote_desc_.size != 0) DeregisterAndFree(*remote_engine_, remote_desc_, remote_buffer_);
  }

  static Result<std::unique_ptr<Link>> Make(const InProcessLinkOptions& o) {
    std::unique_ptr<InProcessLink> link(new InProcessLink());
    link->kind_ = o.kind;
    link->copy_threads_ = o.engine.copy_threads;
    link->bytes_ = o.bytes;
    int device = o.kind == MemoryKind::kCuda ? o.device : -1;
    FERRY_ASSIGN_OR_RETURN(link->local_buffer_, Buffer::Allocate(o.kind, device, o.bytes));
    FERRY_ASSIGN_OR_RETURN(link->remote_buffer_, Buffer::Allocate(o.kind, device, o.bytes));

    EngineOptions local_options = o.engine;
    local_options.key = "bench-initiator";
    EngineOptions remote_options = o.engine;
    remote_options.key = "bench-target";
    FERRY_ASSIGN_OR_RETURN(link->local_engine_, Engine::Create(local_options));
    FERRY_ASSIGN_OR_RETURN(link->remote_engine_, Engine::Create(remote_options));
    FERRY_RETURN_IF_ERROR(link->local_engine_->AddPeer(link->remote_engine_->Describe()));

    FERRY_ASSIGN_OR_RETURN(
        link->local_desc_,
        link->local_engine_->RegisterMemory(link->local_buffer_->data(), o.bytes, o.kind, device));
    FERRY_ASSIGN_OR_RETURN(link->remote_desc_,
                           link->remote_engine_->RegisterMemory(link->remote_buffer_->data(),
                                                                o.bytes, o.kind, device));
    FERRY_ASSIGN_OR_RETURN(link->session_,
                           link->local_engine_->OpenSession(link->local_desc_, link->remote_desc_));
    return std::unique_ptr<Link>(std::move(link));
  }

 private:
  InProcessLink() = default;

  MemoryKind kind_ = MemoryKind::kHost;
  int copy_threads_ = 0;
  uint64_t bytes_ = 0;
  std::unique_ptr<Buffer> local_buffer_;
  std::unique_ptr<Buffer> remote_buffer_;
  std::unique_ptr<Engine> local_engine_;
  std::unique_ptr<Engine> remote_engine_;
  MemoryDesc local_desc_;
  MemoryDesc remote_desc_;
  Session session_;
};

}  // namespace

Result<std::unique_ptr<Link>> MakeInProcessLink(const InProcessLinkOptions& options) {
  return InProcessLink::Make(options);
}

}  // namespace ferry::tools
