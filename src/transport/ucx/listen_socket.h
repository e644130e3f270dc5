// This process's TCP sockets by port, for tests and diagnostics: the listening socket of an
// engine's door (door.h) and the connections it holds. Thread-safe (system calls only).
#pragma once

#include <cstdint>

#include "ferry/status.h"

namespace ferry::internal::ucx {

// The descriptor of this process's TCP listening socket bound to `port`, or -1.
int FindListeningSocket(uint16_t port);

// How many of this process's connected TCP sockets have `port` as their local port: the
// connections a listener on that port accepted and that are still open.
int CountAcceptedConnections(uint16_t port);

}  // namespace ferry::internal::ucx
