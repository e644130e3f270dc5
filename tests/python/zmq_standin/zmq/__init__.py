"""A minimal pure-Python stand-in for the part of pyzmq that ferry's PLE tests use.

Where no pyzmq can be installed (the GPU machine: Python 3.12, no PyPI, and Debian 12's
python3-zmq is built for 3.11), tests/python/ple_helpers.py loads this package as ``zmq`` for
ferry.ple_bridge and vLLM's seed connector. Real pyzmq is always preferred when importable.

What it covers: Context (instance, socket, term, destroy), PUSH and PULL sockets over
``ipc://PATH`` (a Unix stream socket at PATH) and ``inproc://NAME`` (an abstract Unix socket
private to this process), send / send_multipart / recv / recv_multipart with NOBLOCK (raising
Again) and SNDMORE, poll, setsockopt / getsockopt (LINGER, MAXMSGSIZE, SNDHWM, RCVHWM, RCVTIMEO,
SNDTIMEO honoured; others stored and ignored), close. Not wire-compatible with libzmq: both
ends must use this module.

Wire format: each part is a 9-byte header (1 byte: 1 if more parts follow; 8 bytes: the
part's length, little endian) then its bytes; a message is delivered only once all its parts
arrived, so multi-part messages stay together.

As in zmq, a PUSH may connect before the PULL binds (it retries every 20 ms, and queues what is
sent meanwhile), and one PULL takes messages from several PUSH peers (fairly enough: every
readable peer is read in turn). A PUSH's sends go out on a background thread; close() returns at
once and term() waits for unsent messages up to each socket's LINGER (-1 waits at most
_MAX_LINGER_S, so a test cannot hang on a peer that never came).
"""

import collections
import errno
import os
import select
import socket as _socket
import struct
import threading
import time

__version__ = "0.0+ferry-standin"
STANDIN = True  # real pyzmq has no such attribute

PAIR, PUB, SUB, REQ, REP, DEALER, ROUTER, PULL, PUSH = 0, 1, 2, 3, 4, 5, 6, 7, 8
XPUB, XSUB, STREAM = 9, 10, 11
NOBLOCK = DONTWAIT = 1
SNDMORE = 2
POLLIN, POLLOUT, POLLERR = 1, 2, 4
# Socket options (libzmq's numbers).
AFFINITY, IDENTITY, SUBSCRIBE, UNSUBSCRIBE, RATE = 4, 5, 6, 7, 8
SNDBUF, RCVBUF, RCVMORE, FD, EVENTS, TYPE, LINGER = 11, 12, 13, 14, 15, 16, 17
RECONNECT_IVL, BACKLOG, RECONNECT_IVL_MAX, MAXMSGSIZE, SNDHWM, RCVHWM = 18, 19, 21, 22, 23, 24
RCVTIMEO, SNDTIMEO, IPV6, IMMEDIATE = 27, 28, 42, 39
HWM = SNDHWM

_HEADER = struct.Struct("<BQ")
_RETRY_S = 0.02  # reconnect interval of a PUSH whose peer is not (yet) there
_MAX_LINGER_S = 30.0


def zmq_version():
    return "0.0.0"


def pyzmq_version():
    return __version__


class ZMQError(Exception):
    def __init__(self, errno_=None, msg=None):
        self.errno = errno_
        self.strerror = msg or (os.strerror(errno_) if errno_ else "ZMQ stand-in error")
        super().__init__(self.strerror)

    def __str__(self):
        return self.strerror


class Again(ZMQError):
    def __init__(self, msg="Resource temporarily unavailable"):
        super().__init__(errno.EAGAIN, msg)


class ContextTerminated(ZMQError):
    def __init__(self, msg="Context was terminated"):
        super().__init__(errno.ENOTSUP, msg)


class ZMQBindError(ZMQError):
    pass


def _address(endpoint):
    """The Unix socket address of an endpoint (ipc:// a path, inproc:// an abstract name)."""
    if not isinstance(endpoint, str):
        raise TypeError(f"endpoint must be a str, not {type(endpoint).__name__}")
    scheme, sep, rest = endpoint.partition("://")
    if not sep or not rest:
        raise ZMQError(errno.EINVAL, f"invalid endpoint {endpoint!r}")
    if scheme == "ipc":
        if len(rest.encode()) > 107:
            raise ZMQError(errno.ENAMETOOLONG, f"ipc path too long: {rest!r}")
        return rest
    if scheme == "inproc":
        return f"\0ferry-zmq-standin-{os.getpid()}-{rest}"
    raise ZMQError(errno.EPROTONOSUPPORT,
                   f"ferry's zmq stand-in speaks ipc:// and inproc:// only, not {scheme}://")


def _as_bytes(part):
    if isinstance(part, str):
        raise TypeError("str is not bytes: use send_string")
    return bytes(memoryview(part))


class Socket:
    """A PUSH or PULL socket (other types are refused at creation)."""

    def __init__(self, context, socket_type):
        if socket_type not in (PUSH, PULL):
            raise ZMQError(errno.ENOTSUP, "ferry's zmq stand-in has PUSH and PULL sockets "
                           f"only, not {socket_type}")
        self.context, self.socket_type = context, socket_type
        self.closed = False
        self._opts = {LINGER: -1, MAXMSGSIZE: -1, SNDHWM: 1000, RCVHWM: 1000, RCVTIMEO: -1,
                      SNDTIMEO: -1, TYPE: socket_type}
        self._lock = threading.Condition()
        # PUSH: the outgoing messages (encoded) and one sender thread per connected endpoint.
        self._out, self._senders, self._partial = collections.deque(), [], []
        # PULL: listeners, peers (socket -> bytearray) and complete messages.
        self._listeners, self._bound, self._peers = [], [], {}
        self._in, self._rcvmore = collections.deque(), []

    # --- options ---------------------------------------------------------------------------
    def setsockopt(self, option, value):
        self._check_open()
        self._opts[option] = value

    def getsockopt(self, option):
        self._check_open()
        if option == RCVMORE:
            return int(bool(self._rcvmore))
        if option == EVENTS:
            return self.poll(0, POLLIN | POLLOUT)
        return self._opts.get(option, 0)

    set = setsockopt
    get = getsockopt

    def __setattr__(self, name, value):
        opt = globals().get(name.upper()) if name.islower() and not name.startswith("_") else None
        if isinstance(opt, int) and name not in ("closed", "context", "socket_type"):
            self.setsockopt(opt, value)
        else:
            object.__setattr__(self, name, value)

    @property
    def linger(self):
        return self._opts[LINGER]

    def _check_open(self):
        if self.closed:
            raise ZMQError(errno.ENOTSOCK, "Socket operation on non-socket")

    # --- endpoints -------------------------------------------------------------------------
    def bind(self, endpoint):
        self._check_open()
        if self.socket_type != PULL:
            raise ZMQError(errno.ENOTSUP, "ferry's zmq stand-in binds PULL sockets only")
        addr = _address(endpoint)
        if not addr.startswith("\0"):
            try:  # as libzmq: a stale socket file from an earlier run is replaced
                os.unlink(addr)
            except FileNotFoundError:
                pass
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.bind(addr)
            s.listen(64)
        except OSError as e:
            s.close()
            raise ZMQError(e.errno or errno.EADDRINUSE, f"bind {endpoint}: {e}") from None
        s.setblocking(False)
        self._listeners.append(s)
        self._bound.append(addr)

    def connect(self, endpoint):
        self._check_open()
        if self.socket_type != PUSH:
            raise ZMQError(errno.ENOTSUP, "ferry's zmq stand-in connects PUSH sockets only")
        t = threading.Thread(target=self._send_loop, args=(_address(endpoint),),
                             name=f"zmq-standin-push {endpoint}", daemon=True)
        self._senders.append(t)
        t.start()

    # --- PUSH ------------------------------------------------------------------------------
    def send(self, data, flags=0, copy=True, track=False):
        self._check_open()
        if self.socket_type != PUSH:
            raise ZMQError(errno.ENOTSUP, "send on a PULL socket")
        self._partial.append(_as_bytes(data))
        if flags & SNDMORE:
            return None
        parts, self._partial = self._partial, []
        wire = b"".join(_HEADER.pack(1 if i + 1 < len(parts) else 0, len(p)) + p
                        for i, p in enumerate(parts))
        hwm, timeout = self._opts[SNDHWM], self._opts[SNDTIMEO]
        deadline = None if timeout < 0 else time.monotonic() + timeout / 1000
        with self._lock:
            while hwm > 0 and len(self._out) >= hwm:
                if flags & NOBLOCK or (deadline is not None and time.monotonic() >= deadline):
                    raise Again()
                self._lock.wait(0.01 if deadline is None else max(0, deadline - time.monotonic()))
            self._out.append(wire)
            self._lock.notify_all()
        return None

    def send_multipart(self, msg_parts, flags=0, copy=True, track=False):
        parts = list(msg_parts)
        if not parts:
            raise ZMQError(errno.EINVAL, "a message has at least one part")
        for p in parts[:-1]:
            self.send(p, flags | SNDMORE)
        return self.send(parts[-1], flags & ~SNDMORE)

    def _send_loop(self, addr):
        """Connects (retrying until the PULL is bound), then writes queued messages; after
        close() it drains what is left until the linger deadline."""
        conn, wire = None, None
        while True:
            with self._lock:
                if wire is None:
                    while not self._out and not self.closed:
                        self._lock.wait(0.1)
                    if not self._out:
                        break  # closed and nothing left
                    if self.closed and self._linger_over():
                        break
                    wire = self._out.popleft()
                    self._lock.notify_all()
                elif self.closed and self._linger_over():
                    break
            if conn is None:
                conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
                try:
                    conn.connect(addr)
                except OSError:  # not bound yet (or gone): retry, as zmq reconnects
                    conn.close()
                    conn = None
                    time.sleep(_RETRY_S)
                    continue
            try:
                conn.sendall(wire, _socket.MSG_NOSIGNAL)
                wire = None
            except OSError:  # the peer went away: this message goes on the next connection
                conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def _linger_over(self):
        linger = self._opts[LINGER]
        if linger < 0:
            linger = _MAX_LINGER_S * 1000
        return time.monotonic() >= self._closed_at + linger / 1000

    # --- PULL ------------------------------------------------------------------------------
    def _pump(self, timeout_s):
        """Accepts new peers and reads what they sent, waiting up to timeout_s (None: forever)
        for at least one complete message."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._in:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select(self._listeners + list(self._peers), [], [],
                                        0.1 if left is None else min(left, 0.1))
            for s in ready:
                if s in self._listeners:
                    try:
                        peer, _ = s.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    peer.setblocking(False)
                    self._peers[peer] = bytearray()
                else:
                    self._read(s)
            if self._in or (deadline is not None and time.monotonic() >= deadline):
                return

    def _read(self, peer):
        buf = self._peers[peer]
        try:
            data = peer.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the peer closed; a message it left incomplete is dropped
            self._drop(peer)
            return
        buf += data
        limit = self._opts[MAXMSGSIZE]
        pos, parts = 0, []
        while len(buf) - pos >= _HEADER.size:
            more, n = _HEADER.unpack_from(buf, pos)
            if limit >= 0 and n > limit:  # as libzmq: a peer sending more is disconnected
                self._drop(peer)
                return
            if len(buf) - pos - _HEADER.size < n:
                break
            parts.append(bytes(buf[pos + _HEADER.size:pos + _HEADER.size + n]))
            pos += _HEADER.size + n
            if not more:
                self._in.append(parts)
                parts = []
                del buf[:pos]
                pos = 0

    def _drop(self, peer):
        self._peers.pop(peer, None)
        peer.close()

    def poll(self, timeout=None, flags=POLLIN):
        """POLLIN when a message can be received (waiting up to timeout ms; None or -1
        forever), POLLOUT for a PUSH under its high-water mark; 0 otherwise."""
        self._check_open()
        if self.socket_type == PUSH:
            hwm = self._opts[SNDHWM]
            return POLLOUT & flags if hwm <= 0 or len(self._out) < hwm else 0
        if not flags & POLLIN:
            return 0
        if not self._rcvmore and not self._in:
            self._pump(None if timeout is None or timeout < 0 else timeout / 1000)
        return POLLIN if self._rcvmore or self._in else 0

    def recv_multipart(self, flags=0, copy=True, track=False):
        first = self.recv(flags)
        parts = [first]
        while self._rcvmore:
            parts.append(self._rcvmore.pop(0))
        return parts

    def recv(self, flags=0, copy=True, track=False):
        self._check_open()
        if self.socket_type != PULL:
            raise ZMQError(errno.ENOTSUP, "recv on a PUSH socket")
        if self._rcvmore:
            return self._rcvmore.pop(0)
        if not self._in:
            timeout = self._opts[RCVTIMEO]
            self._pump(0 if flags & NOBLOCK else None if timeout < 0 else timeout / 1000)
            if not self._in:
                raise Again()
        parts = self._in.popleft()
        self._rcvmore = parts[1:]
        return parts[0]

    # --- conveniences pyzmq has ------------------------------------------------------------
    def send_string(self, s, flags=0, encoding="utf-8"):
        return self.send(s.encode(encoding), flags)

    def recv_string(self, flags=0, encoding="utf-8"):
        return self.recv(flags).decode(encoding)

    def send_pyobj(self, obj, flags=0, protocol=-1):
        import pickle
        return self.send(pickle.dumps(obj, protocol), flags)

    def recv_pyobj(self, flags=0):
        import pickle
        return pickle.loads(self.recv(flags))

    # --- lifetime --------------------------------------------------------------------------
    def close(self, linger=None):
        if self.closed:
            return
        if linger is not None:
            self._opts[LINGER] = linger
        with self._lock:
            self._closed_at = time.monotonic()
            object.__setattr__(self, "closed", True)
            if self._opts[LINGER] == 0:
                self._out.clear()
            self._lock.notify_all()
        for s in self._listeners + list(self._peers):
            s.close()
        for addr in self._bound:
            if not addr.startswith("\0"):
                try:
                    os.unlink(addr)
                except OSError:
                    pass
        self._listeners, self._peers, self._bound = [], {}, []
        self.context._forget(self)

    def _join(self):
        for t in self._senders:
            t.join(_MAX_LINGER_S + 1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if not self.closed:
                self.close()
        except Exception:  # interpreter shutdown: nothing left to clean
            pass


class Context:
    _instance = None
    _instance_lock = threading.Lock()

    def __init__(self, io_threads=1, **kwargs):
        self.closed = False
        self._sockets, self._closing = [], []
        self._lock = threading.Lock()

    @classmethod
    def instance(cls, io_threads=1):
        with cls._instance_lock:
            if cls._instance is None or cls._instance.closed:
                cls._instance = cls(io_threads)
            return cls._instance

    def socket(self, socket_type, **kwargs):
        if self.closed:
            raise ContextTerminated()
        s = Socket(self, socket_type)
        with self._lock:
            self._sockets.append(s)
        return s

    def _forget(self, sock):
        with self._lock:
            if sock in self._sockets:
                self._sockets.remove(sock)
                self._closing.append(sock)

    def term(self):
        """Waits until every closed socket sent what it had (up to its linger); sockets still
        open are closed first (libzmq would block until the caller closed them)."""
        for s in list(self._sockets):
            s.close()
        for s in list(self._closing):
            s._join()
        self._closing = []
        self.closed = True

    def destroy(self, linger=None):
        for s in list(self._sockets):
            s.close(linger)
        self.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.term()
