#include "embed/uva.h"

#include <cstring>
#include <string>
#include <vector>

#include "cuda/runtime.h"
#include "cuda/stream_ops.h"

namespace ferry::embed {
namespace {

using cuda::UvaHead;
using cuda::UvaStepArgs;

Status CudaError(int error, const char* what) {
  if (error == 0) return Status::Ok();
  return Status(Code::kInternal,
                std::string(what) + " failed with CUDA error " + std::to_string(error));
}

}  // namespace

std::vector<UvaHead> UvaHeads(const Layout& layout) {
  std::vector<UvaHead> heads;
  for (int h = 0; h < layout.num_heads(); ++h)
    heads.push_back(
        {layout.head_sizes()[h], layout.head_mods()[h].magic, layout.head_offsets()[h]});
  return heads;
}

UvaStepArgs UvaBaseArgs(const Layout& layout, const Table& table, const UvaHead* heads,
                        int32_t* error) {
  UvaStepArgs a{};
  a.table = table.data();
  a.table_rows = table.rows();
  a.row_bytes = table.row_bytes();
  a.heads = heads;
  a.num_heads = layout.num_heads();
  a.heads_per_ngram = layout.config().heads_per_ngram;
  a.ngram = layout.ngram_size();
  a.vocab_size = layout.config().vocab_size;
  a.eos = static_cast<uint64_t>(layout.config().eos_id);
  for (int k = 0; k < layout.ngram_size() && k < cuda::kUvaMaxNgram; ++k)
    a.multipliers[k] = layout.multipliers()[k];
  a.error = error;
  return a;
}

Result<std::unique_ptr<UvaGatherer>> UvaGatherer::Create(const Layout& layout, const Table& table,
                                                         int device) {
  if (!cuda::Available())
    return Status(Code::kFailedPrecondition,
                  "the UVA mode needs a GPU: " + cuda::UnavailableReason());
  if (!table.pinned())
    return Status(Code::kFailedPrecondition, "the UVA mode needs a pinned table");
  if (table.data() == nullptr)
    return Status(Code::kInvalidArgument, "the UVA mode needs a table of one segment");
  FERRY_ASSIGN_OR_RETURN(uint64_t row_bytes, RowBytes(table.dtype(), layout.head_dim()));
  if (row_bytes != table.row_bytes() || table.rows() < layout.used_rows())
    return Status(Code::kInvalidArgument, "the table does not fit the layout");
  if (layout.ngram_size() > cuda::kUvaMaxNgram)
    return Status(Code::kInvalidArgument,
                  "the UVA kernel takes ngram_size <= " + std::to_string(cuda::kUvaMaxNgram));

  auto g = std::unique_ptr<UvaGatherer>(new UvaGatherer());
  g->device_ = device;
  std::vector<UvaHead> heads = UvaHeads(layout);
  FERRY_ASSIGN_OR_RETURN(void* dheads, cuda::Malloc(device, heads.size() * sizeof(UvaHead)));
  g->heads_ = static_cast<UvaHead*>(dheads);
  FERRY_RETURN_IF_ERROR(cuda::CopySync(g->heads_, heads.data(), heads.size() * sizeof(UvaHead)));
  FERRY_ASSIGN_OR_RETURN(void* derror, cuda::Malloc(device, sizeof(int32_t)));
  g->error_ = static_cast<int32_t*>(derror);
  FERRY_RETURN_IF_ERROR(cuda::MemsetSync(g->error_, 0, sizeof(int32_t)));

  g->base_ = UvaBaseArgs(layout, table, g->heads_, g->error_);
  return g;
}

UvaGatherer::~UvaGatherer() {
  if (heads_ != nullptr) (void)cuda::Free(heads_);
  if (error_ != nullptr) (void)cuda::Free(error_);
}

Status UvaGatherer::Enqueue(const DeviceStep& step, void* dst, void* stream) {
  if (step.num_tokens < 0 || step.num_reqs < 0 || step.query_start == nullptr ||
      (step.num_tokens > 0 && (step.tokens == nullptr || dst == nullptr)) ||
      (step.num_reqs > 0 && step.context == nullptr))
    return Status(Code::kInvalidArgument, "a UVA step needs its inputs and output");
  UvaStepArgs a = base_;
  a.tokens = step.tokens;
  a.query_start = step.query_start;
  a.context = step.context;
  a.num_tokens = step.num_tokens;
  a.num_reqs = step.num_reqs;
  a.dst = static_cast<uint8_t*>(dst);
  return CudaError(cuda::LaunchUvaGather(a, static_cast<CUstream_st*>(stream)),
                   "the UVA gather launch");
}

Status UvaGatherer::CheckErrors() {
  int32_t error = 0;
  FERRY_RETURN_IF_ERROR(cuda::CopySync(&error, error_, sizeof(error)));
  if (error == cuda::kUvaOk) return Status::Ok();
  FERRY_RETURN_IF_ERROR(cuda::MemsetSync(error_, 0, sizeof(int32_t)));
  if (error == cuda::kUvaIdOutOfRange)
    return Status(Code::kOutOfRange, "a token id of the step is outside the vocabulary");
  if (error == cuda::kUvaQueryStartPastEnd)
    return Status(Code::kOutOfRange, "the step's last query start is past its tokens");
  return Status(Code::kInvalidArgument, "the step's query start locations are not sound");
}

Status UvaGatherer::GatherSync(const StepInput& in, void* dst) {
  if (in.query_start_loc.empty())
    return Status(Code::kInvalidArgument, "query_start_loc needs num_reqs + 1 >= 1 entries");
  if (static_cast<int64_t>(in.ngram_context.size()) != in.num_reqs() * (base_.ngram - 1))
    return Status(Code::kInvalidArgument, "ngram_context has the wrong size");
  // One device buffer for the three inputs.
  const size_t n_tok = in.tokens.size(), n_qsl = in.query_start_loc.size(),
               n_ctx = in.ngram_context.size();
  FERRY_ASSIGN_OR_RETURN(void* buf, cuda::Malloc(device_, (n_tok + n_qsl + n_ctx + 1) * 4));
  auto* d = static_cast<int32_t*>(buf);
  Status s = Status::Ok();
  if (n_tok) s = cuda::CopySync(d, in.tokens.data(), n_tok * 4);
  if (s.ok()) s = cuda::CopySync(d + n_tok, in.query_start_loc.data(), n_qsl * 4);
  if (s.ok() && n_ctx) s = cuda::CopySync(d + n_tok + n_qsl, in.ngram_context.data(), n_ctx * 4);
  DeviceStep step{d, d + n_tok, d + n_tok + n_qsl, static_cast<int64_t>(n_tok), in.num_reqs()};
  if (s.ok()) s = Enqueue(step, dst, nullptr);
  if (s.ok()) s = cuda::StreamSync(nullptr, Deadline());  // the legacy default stream
  if (s.ok()) s = CheckErrors();
  (void)cuda::Free(buf);
  return s;
}

}  // namespace ferry::embed
