// The listening socket under a UCX sockaddr listener, which UCX does not expose: found by its
// port, so that an engine that shuts down can stop new connections before it destroys the
// listener (see Core::~Core). Thread-safe (system calls only).
#pragma once

#include <cstdint>

#include "ferry/status.h"

namespace ferry::internal::ucx {

// The descriptor of this process's TCP listening socket bound to `port`, or -1.
int FindListeningSocket(uint16_t port);

// How many of this process's connected TCP sockets have `port` as their local port: the
// connections a listener on that port accepted and that are still open.
int CountAcceptedConnections(uint16_t port);

// Makes the listening socket on `port` drop every new connection attempt from now on (a socket
// filter that accepts no packet), while connections it already accepted go on. kNotFound when
// no listening socket of this process has that port.
Status RefuseNewConnections(uint16_t port);

}  // namespace ferry::internal::ucx
