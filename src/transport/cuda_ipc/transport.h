// The `cuda_ipc` transport: GPU memory between processes of one host.
//
// Registration exports the CUDA IPC handle of the allocation that contains a GPU region, the
// region's offset in it, and a slot of the engine's lease table (lease_table.h). Memory mapped
// with the VMM API (cuMemMap) has no IPC handle: its allocations are exported as POSIX file
// descriptors instead (kept open while the region is registered), which a peer takes with
// pidfd_getfd from the owner's process (its pid is in the process token; a descriptor naming
// another process is rejected) and maps into one range of its own. A peer on the
// same host (same host id, another process: a process cannot open its own handles, and the
// `local` transport covers it) opens each allocation once per peer endpoint
// (cudaIpcOpenMemHandle with lazy peer access), caches the mapping, and closes it once every
// region it reached was revoked, or when the endpoint and its sessions are gone. A batch is
// one Copier post on the device of the local region (copier.h: one kernel launch for the small
// pieces, DMA for large ones), completed by polling.
//
// Access lists (RegionOptions::allowed_peers): a region with one is not exported here
// (Register returns kUnsupported). Its handle would travel in the descriptor, open to any
// process of the host that sees it, and this transport has no authenticated connection of its
// own to hand it to allowed peers only; peers reach such a region through ucx (staged), which
// checks every request.
//
// Deregistration contract: the owner's DeregisterMemory() withdraws the region's lease slot
// and waits until no live peer process holds a lease on it; every batch of a peer holds a
// lease from before its copies are enqueued until they are complete on the GPU. So once
// deregistration returns, no peer copy into the region runs or can start (a peer's next batch
// fails with kFailedPrecondition). A peer that does not drain before the engine's retire
// deadline is reported in the log, and its slot is never reused.
//
// The transport has no notifications of its own: the engine routes a session's notifications
// through another transport that reaches the peer (see EngineCore::OpenSession).
//
// Thread safety: as Transport (transport.h).
#pragma once

#include <memory>
#include <string>

#include "cuda/ipc_api.h"
#include "transport/cuda_ipc/copier.h"
#include "transport/transport.h"

namespace ferry::internal::cuda_ipc {

// What the transport reaches CUDA through; tests replace these.
struct Seams {
  cuda::IpcApi* api = nullptr;     // outlives the transport
  std::unique_ptr<Copier> copier;
  std::string process_token;       // identifies this process among the host's processes
};

// This process's token (pid and random bits).
const std::string& ProcessToken();

Result<std::unique_ptr<Transport>> MakeTransport(const TransportContext& ctx, Seams seams);

}  // namespace ferry::internal::cuda_ipc
