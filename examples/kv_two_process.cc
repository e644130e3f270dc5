// Disaggregated prefill and decode on one host: two processes, each an Engine and a
// ferry::kv::Connector over `shm`, move the KV cache of a few requests in write mode.
//   prefill (this process, producer)          decode (a forked child, consumer)
//   ServeHandshake; its address over a pipe <-> the same; each AddPeerFrom(the other's)
//                                              ExpectWrite(request, decode blocks)
//   SaveLayer(request, layer, blocks) x L, Seal --> WaitFinished: done; every byte checked
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/kv.h"
#include "ferry/shared_memory.h"

namespace kv = ferry::kv;

namespace {

// A worker; its cache is in shareable host memory (which `shm` peers map). Destroyed bottom-up.
struct Worker {
  kv::CacheLayout layout;
  std::vector<ferry::HostBuffer> memory;
  std::unique_ptr<ferry::Engine> engine;
  std::unique_ptr<kv::Connector> conn;
};

ferry::Status MakeWorker(const std::string& name, kv::Role role, Worker& w) {
  kv::CacheLayout id;  // what both sides must agree on, and this worker's share (all heads)
  id.model = "example-model";
  id.dtype_bytes = 2, id.head_dim = 64, id.total_kv_heads = 4, id.num_layers = 4;
  id.block_tokens = 16, id.num_blocks = 32;  // kKvFirst: [2, N, bs, H, D], a region a layer
  FERRY_ASSIGN_OR_RETURN(w.layout, kv::MakeLayout(id, kv::TensorOrder::kKvFirst));
  ferry::EngineOptions eo;
  eo.key = name, eo.transports = {"shm"};
  FERRY_ASSIGN_OR_RETURN(w.engine, ferry::Engine::Create(eo));
  std::vector<ferry::MemoryDesc> regions;
  for (uint64_t bytes : w.layout.region_bytes) {
    FERRY_ASSIGN_OR_RETURN(ferry::HostBuffer buffer, ferry::AllocateSharedHost(bytes));
    FERRY_ASSIGN_OR_RETURN(ferry::MemoryDesc desc, w.engine->RegisterMemory(buffer.data(), bytes));
    regions.push_back(desc);
    w.memory.push_back(std::move(buffer));
  }
  kv::ConnectorOptions o;
  o.role = role, o.mode = kv::Mode::kWrite, o.instance = name;
  FERRY_ASSIGN_OR_RETURN(w.conn, kv::Connector::Create(w.engine.get(), w.layout, regions, o));
  return ferry::Status::Ok();
}

// Each side serves a handshake endpoint and sends "host:port" through a pipe; the peer fetches
// the metadata (engine, layout, regions) from it and checks that the two are compatible.
ferry::Status Meet(Worker& w, int out_fd, int in_fd) {
  FERRY_ASSIGN_OR_RETURN(std::string mine, w.conn->ServeHandshake());
  mine += '\n';  // a failed write shows as the peer's AddPeerFrom("") failing
  (void)!write(out_fd, mine.data(), mine.size());
  std::string theirs;
  for (char c; read(in_fd, &c, 1) == 1 && c != '\n';) theirs += c;
  return w.conn->AddPeerFrom(theirs);
}

struct Request {  // its tokens, and the blocks each side holds them in (they differ on purpose)
  std::string id;
  uint64_t tokens;
  std::vector<uint64_t> prefill_blocks, decode_blocks;
};
const Request kRequests[] = {{"req-0", 40, {0, 1, 2}, {31, 30, 29}},
                             {"req-1", 16, {3}, {7}},
                             {"req-2", 70, {4, 5, 6, 7, 8}, {12, 3, 20, 21, 9}}};

// Fills (or, with fill false, checks) one layer of request r's tokens in `blocks`, each byte
// (K or V, token, head, i) placed by the layout's strides. Returns how many bytes differ.
uint64_t FillOrCheck(Worker& w, size_t r, uint32_t layer, const std::vector<uint64_t>& blocks,
                     uint64_t tokens, bool fill) {
  uint64_t wrong = 0, bs = w.layout.block_tokens;
  for (int k = 0; k < 2; ++k) {
    const kv::TensorLayout& t = k == 0 ? w.layout.layers[layer].k : *w.layout.layers[layer].v;
    for (uint64_t tok = 0; tok < tokens; ++tok) {
      std::byte* at = w.memory[t.region].data() + t.offset + blocks[tok / bs] * t.block_stride +
                      (tok % bs) * t.token_stride;
      for (uint32_t h = 0; h < w.layout.heads(); ++h)
        for (uint64_t i = 0; i < w.layout.head_bytes(); ++i) {
          const auto want = std::byte(1 + r * 101 + layer * 37 + k * 17 + tok * 11 + h * 5 + i);
          std::byte& b = at[h * t.head_stride + i];
          if (fill) b = want;
          wrong += b != want;
        }
    }
  }
  return wrong;
}

// Waits (10 s at most) until `request` ends on this side: OK when it ended done.
ferry::Status WaitDone(Worker& w, const std::string& request) {
  for (int i = 0; i < 100; ++i)
    for (const kv::Finished& f : w.conn->WaitFinished(std::chrono::milliseconds(100)))
      if (f.request == request)
        return f.outcome == kv::Outcome::kDone ? ferry::Status::Ok() : f.status;
  return ferry::MakeStatus(ferry::Code::kDeadlineExceeded, request + " did not end");
}

// One side of the example; returns the process's exit status.
int Run(bool prefill, int out_fd, int in_fd) {
  const char* name = prefill ? "prefill" : "decode";
  Worker w;
  ferry::Status s = MakeWorker(name, prefill ? kv::Role::kProducer : kv::Role::kConsumer, w);
  if (s.ok()) s = Meet(w, out_fd, in_fd);
  for (size_t r = 0; s.ok() && r < std::size(kRequests); ++r) {
    const Request& q = kRequests[r];
    if (prefill) {  // compute (here: fill) each layer, save it, then seal the request
      for (uint32_t layer = 0; s.ok() && layer < w.layout.num_layers; ++layer) {
        FillOrCheck(w, r, layer, q.prefill_blocks, q.tokens, /*fill=*/true);
        // No ReadyFn: the layer is ready now. On a GPU pass kv::EventReady(cuda_event).
        s = w.conn->SaveLayer(q.id, layer, q.prefill_blocks);
      }
      if (s.ok()) s = w.conn->Seal(q.id, w.layout.num_layers);
    } else {  // allocate blocks and ask for the request's KV
      s = w.conn->ExpectWrite(q.id, "prefill", 0, q.decode_blocks, q.tokens);
    }
    if (s.ok()) s = WaitDone(w, q.id);  // producer: its writes landed, its blocks are free
    if (!s.ok() || prefill) continue;
    uint64_t wrong = 0;
    for (uint32_t layer = 0; layer < w.layout.num_layers; ++layer)
      wrong += FillOrCheck(w, r, layer, q.decode_blocks, q.tokens, /*fill=*/false);
    if (wrong) s = ferry::MakeStatus(ferry::Code::kDataLoss, std::to_string(wrong) + " bytes");
    std::printf("decode: %s: %llu wrong bytes\n", q.id.c_str(), (unsigned long long)wrong);
  }
  if (!s.ok()) std::fprintf(stderr, "%s: %s\n", name, s.ToString().c_str());
  return s.ok() ? 0 : 1;
}

}  // namespace

int main() {
  int to_decode[2], to_prefill[2];
  if (pipe(to_decode) != 0 || pipe(to_prefill) != 0) return 1;
  const pid_t child = fork();  // before any engine exists, so no thread is copied
  if (child < 0) return 1;
  if (child == 0) {  // each closes the other's write end: a peer that dies ends a read
    close(to_decode[1]);
    std::exit(Run(/*prefill=*/false, to_prefill[1], to_decode[0]));
  }
  close(to_prefill[1]);
  const int rc = Run(/*prefill=*/true, to_decode[1], to_prefill[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
