// A `ferry pd` worker: one (instance, DP rank, TP rank) of a prefill or decode instance, started
// by the router as `ferry pd-worker --fd N` and driven over that socket (pd_channel.h).
//
// Messages, router -> worker: config {config}, peers {addrs}, prefill {req, n, tokens, blocks},
// expect {req, n, tokens, producer, blocks} (decode, write mode), read {req, n, tokens, blocks,
// params} (decode, read mode), abort {req}, stop {wait_ms}.
// Worker -> router: ready {addr, id}, peered, sealed / held {req, ns[, params]} (prefill: its
// last layer computed), end {req, outcome, why, ns, bad_bytes, checked, first_bad},
// final {stats, pending, held_blocks}, error {why}.
//
// Thread safety: RunWorker owns the process.
#pragma once

namespace ferry::tools::pd {

// Runs the worker on socket `fd` until the router says stop or goes away; the exit status.
int RunWorker(int fd);

}  // namespace ferry::tools::pd
