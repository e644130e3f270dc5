"""MoRI-IO's Python API (``mori.io``) on ferry's engine: ``import ferry.mori as io``.

Code written for MoRI-IO runs unchanged with ``from ferry.mori import ...`` in place of
``from mori.io import ...``: ``IOEngine(key, IOEngineConfig(host, port))``, ``create_backend``,
``register_torch_tensor``, ``create_session``, ``batch_write``/``batch_read``,
``TransferStatus.Wait()``, ``pop_inbound_transfer_status``. docs/mori.md says what maps to what.

What differs from MoRI-IO:

* No transfer waits for ever. Every transfer has ferry's deadline (the engine's
  ``default_deadline_ms``, 30 s unless ``IOEngine(key, config, default_deadline_ms=...)`` or
  FERRY_DEFAULT_DEADLINE says otherwise): a ``Wait()`` on a transfer to a dead or stalled
  peer, which can block MoRI-IO for ever, returns with ``Failed()`` true and a message that
  starts with ``DEADLINE_EXCEEDED`` (or ``UNAVAILABLE`` once the peer is known dead).
* Backends name transports, not devices: BackendType.RDMA and TCP use ferry's ucx transport
  (RDMA verbs where UCX finds them, TCP otherwise, so an RDMA backend works on a host without
  RDMA devices); XGMI uses the same-host transports (CUDA IPC, shared memory). Each session
  takes the fastest transport both sides have, whichever backends were created.
* Statuses of one engine to one remote engine complete in posting order: a status reports
  success only once every transfer posted before it to the same remote engine has ended, so
  when "the last status succeeded" no earlier transfer is still moving bytes (each of them
  landed, or its own status failed).
* ``pop_inbound_transfer_status`` reports transfers that succeeded; a failed one is not
  reported (the initiator's status has the error). The target keeps at most
  MAX_INBOUND_STATUSES unpopped statuses (the oldest go first).
* ``EngineDesc``/``MemoryDesc`` ``pack()`` bytes carry ferry's descriptors: ferry.mori reads
  them, MoRI-IO does not (and the reverse).
* Options: IOEngineConfig and the first RdmaBackendConfig, then the FERRY_UCX_* variables,
  then IOEngine(key, config, **options)'s keyword arguments (any of ferry.Engine's).
* Extensions: ``register_torch_tensor`` also takes any writable buffer (a numpy array);
  ``IOEngine.close()``; ``IOEngine.ferry_engine``.
"""

import collections
import logging
import operator
import os
import socket
import struct
import threading
import time
import weakref

from . import Engine as _Engine
from . import Error as _Error
from ._mori_types import (
    _ERR_BEGIN,
    TORCH_DEVICE_TYPE_MAP,
    BackendType,
    EngineDesc,
    FabricBackendConfig,
    IOEngineConfig,
    MemoryDesc,
    MemoryLocationType,
    PollCqMode,
    RdmaBackendConfig,
    StatusCode,
    XgmiBackendConfig,
    _mori_code,
    set_log_level,
)

__all__ = [
    "BackendType", "EngineDesc", "FabricBackendConfig", "IOEngine", "IOEngineConfig",
    "IOEngineSession", "MAX_INBOUND_STATUSES", "MemoryDesc", "MemoryLocationType", "PollCqMode",
    "RdmaBackendConfig", "StatusCode", "TORCH_DEVICE_TYPE_MAP", "TransferStatus",
    "XgmiBackendConfig", "set_log_level",
]

_log = logging.getLogger("ferry.mori")

# The notification topic of inbound statuses (the application's own topic '' stays free).
TOPIC = "ferry.mori"
MAX_INBOUND_STATUSES = 1 << 16
_DRAIN_INTERVAL_S = 0.05  # keeps the receiver's bounded notification backlog from filling


# --- statuses ----------------------------------------------------------------------------

class _Order:
    """Posting order of one engine's transfers to one remote engine: which have not all ended.
    Only a deque of transfers not yet known to have ended is kept (no chain between statuses)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next = 0
        self._open = collections.deque()  # (seq, ferry.Transfer), posting order

    def add(self, transfer) -> int:
        with self._lock:
            self._advance()
            seq = self._next
            self._next += 1
            self._open.append((seq, transfer))
            return seq

    def _advance(self):
        while self._open and self._open[0][1].test():
            self._open.popleft()

    def settled_before(self, seq) -> bool:
        with self._lock:
            self._advance()
            return not self._open or self._open[0][0] >= seq

    def earlier(self, seq) -> list:
        with self._lock:
            return [t for s, t in self._open if s < seq]


class TransferStatus:
    """The outcome of one transfer (or batch). TransferStatus() starts INIT; Update/SetCode/
    SetMessage set it by hand, as MoRI-IO's. Wait() ends: ferry's deadline bounds it."""

    def __init__(self, code=StatusCode.INIT, message="", _transfer=None, _order=None, _seq=0):
        self._lock = threading.Lock()
        self._code, self._message = StatusCode(code), message
        self._transfer, self._order, self._seq = _transfer, _order, _seq

    def _poll(self):
        """(code, message); settles into _code once the transfer and its predecessors ended."""
        with self._lock:
            t = self._transfer
            if t is None:
                return self._code, self._message
            if not t.test():
                return StatusCode.IN_PROGRESS, ""
            name, message = t.status()
            if name == "OK" and not self._order.settled_before(self._seq):
                return StatusCode.IN_PROGRESS, ""
            self._code = _mori_code(name)
            self._message = "" if name == "OK" else f"{name}: {message}"
            self._transfer = self._order = None
            return self._code, self._message

    def Code(self) -> StatusCode:
        return self._poll()[0]

    def Message(self) -> str:
        return self._poll()[1]

    def Init(self) -> bool:
        return self.Code() == StatusCode.INIT

    def InProgress(self) -> bool:
        return self.Code() == StatusCode.IN_PROGRESS

    def Succeeded(self) -> bool:
        return self.Code() == StatusCode.SUCCESS

    def Failed(self) -> bool:
        return self.Code() > _ERR_BEGIN

    def SetCode(self, code) -> None:
        with self._lock:
            self._code, self._transfer = StatusCode(code), None

    def SetMessage(self, message: str) -> None:
        with self._lock:
            self._message = message

    def Update(self, code, message: str) -> None:
        if not self.Failed():
            with self._lock:
                self._code, self._message, self._transfer = StatusCode(code), message, None

    def Wait(self) -> None:
        self.WaitFor(-1)

    def WaitFor(self, timeout_ms: float = -1) -> StatusCode:
        """Waits until the status is no longer IN_PROGRESS or timeout_ms passed (-1: until
        the transfer ends, which its deadline bounds); returns Code()."""
        with self._lock:
            t, order, seq = self._transfer, self._order, self._seq
        if t is not None:
            clock = _Clock(timeout_ms)
            for each in [t] + order.earlier(seq):
                try:
                    if not each.wait(timeout_ms=clock.left()):
                        break
                except _Error:
                    pass  # its own status says why; an earlier one's failure is not ours
        return self.Code()

    def __repr__(self):
        code, message = self._poll()
        return f"TransferStatus({code.name}{', ' + repr(message) if message else ''})"


class _Clock:
    def __init__(self, timeout_ms):
        self._end = None if timeout_ms is None or timeout_ms < 0 else time.monotonic() + timeout_ms / 1e3

    def left(self):
        """Milliseconds left, None without a limit."""
        return None if self._end is None else max(0.0, (self._end - time.monotonic()) * 1e3)


def _failed(code, message) -> TransferStatus:
    return TransferStatus(code, message)


def _check_batch(local_offsets, remote_offsets, sizes, local_size, remote_size):
    """[(local, remote, size)] or a failed TransferStatus (MoRI-IO's ERR_INVALID_ARGS)."""
    lo, ro, sz = list(local_offsets), list(remote_offsets), list(sizes)
    if not len(lo) == len(ro) == len(sz):
        return _failed(StatusCode.ERR_INVALID_ARGS,
                       f"{len(lo)} local offsets, {len(ro)} remote offsets, {len(sz)} sizes")
    ops = []
    for i, op in enumerate(zip(lo, ro, sz)):
        try:
            op = tuple(operator.index(v) for v in op)  # ints, numpy's too; not floats
        except TypeError:
            return _failed(StatusCode.ERR_INVALID_ARGS, f"op {i}: {op} needs integers")
        if min(op) < 0 or op[0] + op[2] > local_size or op[1] + op[2] > remote_size:
            return _failed(StatusCode.ERR_INVALID_ARGS,
                           f"op {i}: {op} exceeds the regions ({local_size}, {remote_size} bytes)")
        ops.append(op)
    return ops


# --- sessions and the engine ------------------------------------------------------------

class IOEngineSession:
    """Transfers between one local and one remote region, at byte offsets inside them."""

    def __init__(self, engine, session, local, remote):
        self._engine, self._session, self._local, self._remote = engine, session, local, remote

    def allocate_transfer_uid(self) -> int:
        return self._engine.allocate_transfer_uid()

    def read(self, local_offset, remote_offset, size, uid) -> TransferStatus:
        return self.batch_read([local_offset], [remote_offset], [size], uid)

    def write(self, local_offset, remote_offset, size, uid) -> TransferStatus:
        return self.batch_write([local_offset], [remote_offset], [size], uid)

    def batch_read(self, local_offsets, remote_offsets, sizes, uid) -> TransferStatus:
        return self._post(False, local_offsets, remote_offsets, sizes, uid)

    def batch_write(self, local_offsets, remote_offsets, sizes, uid) -> TransferStatus:
        return self._post(True, local_offsets, remote_offsets, sizes, uid)

    def alive(self) -> bool:
        """False once the engine closed, the remote engine was deregistered or either region
        was deregistered; a peer that died shows in the statuses (UNAVAILABLE, deadline)."""
        return self._engine._session_alive(self)

    def _post(self, write, local_offsets, remote_offsets, sizes, uid) -> TransferStatus:
        if not isinstance(uid, int) or not 0 <= uid < 1 << 64:
            raise ValueError(f"transfer uid {uid!r} is not an integer in [0, 2**64)")
        if not self.alive():
            return _failed(StatusCode.ERR_BAD_STATE, "the session is no longer alive")
        ops = _check_batch(local_offsets, remote_offsets, sizes, self._local.size,
                           self._remote.size)
        if isinstance(ops, TransferStatus):
            return ops
        if not ops:
            return TransferStatus(StatusCode.SUCCESS)
        return self._engine._post(self, write, ops, uid)


class IOEngine:
    """MoRI-IO's IOEngine on a ferry.Engine. Extra keyword arguments go to ferry.Engine
    (e.g. default_deadline_ms, transports); the ferry engine starts on first use, so that the
    first create_backend's options apply to it."""

    Session = IOEngineSession

    def __init__(self, key: str, config: "IOEngineConfig | None" = None, **ferry_options):
        self._key, self._config = key, config or IOEngineConfig()
        self._ferry_options = ferry_options
        self._lock = threading.RLock()
        self._engine = None
        self._backends = {}
        self._notify = True
        self._uid = 0
        self._remotes = {}      # key -> EngineDesc
        self._sessions = {}     # (local region, remote key, remote region) -> IOEngineSession
        self._regions = set()   # local regions registered
        self._orders = {}       # remote key -> _Order
        self._inbound = collections.OrderedDict()  # (remote key, uid) -> TransferStatus
        self._stop = threading.Event()

    # The ferry engine and the thread that keeps inbound statuses.
    @property
    def ferry_engine(self):
        with self._lock:
            if self._engine is None:
                self._start({})
            return self._engine

    def _start(self, backend_options):
        # Layered, later beats earlier: IOEngineConfig and the code's RdmaBackendConfig; the
        # FERRY_* environment (the operator's say, e.g. FERRY_UCX_PROGRESS=event where
        # POLLING's busy core is too dear); IOEngine's own keyword arguments.
        options = {}
        if self._config.host:
            options["listen_host"] = self._config.host
        if self._config.port:
            options["listen_port"] = int(self._config.port)
        options.update(backend_options)
        # Each is a ucx option; ferry.Engine applies the environment, then its arguments.
        options = {k: v for k, v in options.items() if "FERRY_UCX_" + k.upper() not in os.environ}
        options.update(self._ferry_options)
        self._engine = _Engine(key=self._key, **options)
        ref = weakref.ref(self)
        threading.Thread(target=_drain_loop, args=(ref, self._stop), daemon=True,
                         name=f"ferry-mori-inbound-{self._key}").start()

    def close(self) -> None:
        """Stops the engine (its transfers end ABORTED); later calls raise."""
        self._stop.set()
        with self._lock:
            if self._engine is not None:
                self._engine.close()

    def create_backend(self, backend_type, config=None) -> None:
        backend_type = BackendType(backend_type)
        if backend_type in (BackendType.Unknown, BackendType.FABRIC):
            raise RuntimeError(f"ferry.mori has no {backend_type.name} backend")
        with self._lock:
            if backend_type in self._backends:
                _log.warning("backend %s exists already", backend_type.name)
                return
            if backend_type in (BackendType.RDMA, BackendType.TCP):
                config = config or RdmaBackendConfig()
                self._notify = bool(getattr(config, "enable_notification", True))
                if self._engine is None:
                    self._start(getattr(config, "_ferry_options", dict)())
                else:
                    _log.info("engine %s started before this backend: its options stay",
                              self._key)
            self._backends[backend_type] = config

    def remove_backend(self, backend_type) -> None:
        with self._lock:
            self._backends.pop(BackendType(backend_type), None)

    def get_engine_desc(self) -> EngineDesc:
        desc = self.ferry_engine.describe()
        host, port = self._config.host, int(self._config.port)
        for address in desc.addresses:
            h, _, p = address.rpartition(":")
            host, port = host or h.strip("[]"), int(p)
            break
        return EngineDesc(self._key, desc.host_id, socket.gethostname(), host, port, desc.pid,
                          desc)

    def register_remote_engine(self, engine_desc) -> None:
        if not isinstance(engine_desc, EngineDesc):
            engine_desc = EngineDesc.unpack(engine_desc)
        self.ferry_engine.add_peer(engine_desc.ferry)
        with self._lock:
            self._remotes[engine_desc.key] = engine_desc

    def deregister_remote_engine(self, engine_desc) -> None:
        key = engine_desc.key if isinstance(engine_desc, EngineDesc) else str(engine_desc)
        with self._lock:
            if self._remotes.pop(key, None) is None:
                return
            self._sessions = {k: s for k, s in self._sessions.items() if k[1] != key}
        self.ferry_engine.remove_peer(key)

    def register_memory(self, ptr: int, size: int, device_id: int, mem_loc) -> MemoryDesc:
        gpu = MemoryLocationType(mem_loc) == MemoryLocationType.GPU
        desc = self.ferry_engine.register_memory(int(ptr), int(size), kind="cuda" if gpu else "host",
                                                 device=int(device_id) if gpu else -1)
        with self._lock:
            self._regions.add(desc.region)
        return MemoryDesc(desc)

    def register_torch_tensor(self, tensor) -> MemoryDesc:
        """A contiguous torch tensor (CPU or CUDA); ferry also takes a writable buffer."""
        if not hasattr(tensor, "data_ptr"):
            desc = self.ferry_engine.register_memory(tensor)
        else:
            if not tensor.is_contiguous():
                raise RuntimeError("input tensor must be contiguous")
            loc = TORCH_DEVICE_TYPE_MAP.get(tensor.device.type)
            if loc is None:
                raise RuntimeError(f"cannot register {tensor.device.type} memory")
            gpu = loc == MemoryLocationType.GPU
            index = tensor.device.index
            if index is None:
                index = tensor.get_device() if gpu else -1
            desc = self.ferry_engine.register_memory(
                tensor.data_ptr(), tensor.nelement() * tensor.element_size(),
                kind="cuda" if gpu else "host", device=index if gpu else -1, owner=tensor)
        with self._lock:
            self._regions.add(desc.region)
        return MemoryDesc(desc)

    def deregister_memory(self, mem_desc: MemoryDesc) -> None:
        with self._lock:
            self._sessions = {k: s for k, s in self._sessions.items() if k[0] != mem_desc.id}
        self.ferry_engine.deregister_memory(mem_desc.ferry)  # raises if still in use: stays
        with self._lock:
            self._regions.discard(mem_desc.id)

    def allocate_transfer_uid(self) -> int:
        with self._lock:
            uid, self._uid = self._uid, self._uid + 1
            return uid

    def create_session(self, local_mem: MemoryDesc, remote_mem: MemoryDesc):
        """An IOEngineSession, or None (logged) when the regions cannot be reached."""
        with self._lock:
            return self._session(local_mem, remote_mem, quiet=False)

    def _session(self, local, remote, quiet=True):
        why = None
        if local.ferry is None or remote.ferry is None:
            why = "an empty MemoryDesc"
        elif local.engine_key != self._key or local.id not in self._regions:
            why = f"local region {local.id} of {local.engine_key!r} is not registered here"
        elif remote.engine_key != self._key and remote.engine_key not in self._remotes:
            why = f"remote engine {remote.engine_key!r} is not registered"
        key = (local.id, remote.engine_key, remote.id)
        if why is None and key in self._sessions:
            return self._sessions[key]
        if why is None:
            try:
                session = self.ferry_engine.open_session(local.ferry, remote.ferry)
            except _Error as e:
                why = str(e)
        if why is not None:
            if not quiet:
                _log.warning("create_session failed: %s", why)
            return None
        s = IOEngineSession(self, session, local, remote)
        self._sessions[key] = s
        return s

    def _session_alive(self, s) -> bool:
        with self._lock:
            return (self._engine is not None and not self._engine.closed and
                    self._sessions.get((s._local.id, s._remote.engine_key, s._remote.id)) is s)

    def _post(self, s, write, ops, uid) -> TransferStatus:
        remote_key = s._remote.engine_key
        with self._lock:
            order = self._orders.setdefault(remote_key, _Order())
        try:
            t = (s._session.write_batch if write else s._session.read_batch)(ops)
        except _Error as e:
            return _failed(_mori_code(e.code), str(e))
        if self._notify:
            # The target's inbound status: a one-way notice once the transfer ended well (after
            # its bytes, for a write). A message of its own, not the write's notification, so
            # that a target whose backlog is full loses the notice (counted there) and never
            # fails the initiator's transfer.
            try:
                self._engine.notify_after(remote_key, struct.pack("<cQ", b"W" if write else b"R",
                                                                  uid), [t], topic=TOPIC)
            except _Error as e:
                _log.warning("inbound status of transfer %d not sent: %s", uid, e)
        return TransferStatus(StatusCode.IN_PROGRESS, "", t, order, order.add(t))

    def _pair_post(self, write, local_mem, local_offsets, remote_mem, remote_offsets, sizes, uid):
        with self._lock:
            s = self._session(local_mem, remote_mem)
        if s is None:
            return _failed(StatusCode.ERR_NOT_FOUND,
                           f"no session from region {local_mem.id} to {remote_mem.engine_key!r}"
                           f" region {remote_mem.id}")
        return s._post(write, local_offsets, remote_offsets, sizes, uid)

    def read(self, local_mem, local_offset, remote_mem, remote_offset, size, uid):
        return self._pair_post(False, local_mem, [local_offset], remote_mem, [remote_offset],
                               [size], uid)

    def write(self, local_mem, local_offset, remote_mem, remote_offset, size, uid):
        return self._pair_post(True, local_mem, [local_offset], remote_mem, [remote_offset],
                               [size], uid)

    def _batch(self, write, local_mems, local_offsets, remote_mems, remote_offsets, sizes, uids):
        lists = [list(x) for x in (local_mems, local_offsets, remote_mems, remote_offsets, sizes,
                                   uids)]
        if len({len(x) for x in lists}) != 1:
            raise ValueError("batch lists differ in length: " + str([len(x) for x in lists]))
        return [self._pair_post(write, *args) for args in zip(*lists)]

    def batch_read(self, local_mems, local_offsets, remote_mems, remote_offsets, sizes, uids):
        """One status per memory pair."""
        return self._batch(False, local_mems, local_offsets, remote_mems, remote_offsets, sizes,
                           uids)

    def batch_write(self, local_mems, local_offsets, remote_mems, remote_offsets, sizes, uids):
        """One status per memory pair."""
        return self._batch(True, local_mems, local_offsets, remote_mems, remote_offsets, sizes,
                           uids)

    def wait_all(self, statuses, timeout_ms: float = -1) -> StatusCode:
        """SUCCESS when every status succeeded (an empty list too); the first failure seen
        as soon as one is seen; IN_PROGRESS when timeout_ms passed first."""
        clock, pending = _Clock(timeout_ms), False
        for s in statuses:
            left = clock.left()
            code = s.WaitFor(-1 if left is None else left)
            if code > _ERR_BEGIN:
                return code
            pending = pending or code == StatusCode.IN_PROGRESS
        return StatusCode.IN_PROGRESS if pending else StatusCode.SUCCESS

    def pop_inbound_transfer_status(self, remote_key: str, transfer_uid: int):
        """The status of a transfer that engine remote_key made on this engine's memory with
        that uid, once; None if it is unknown (not landed yet, failed, or notifications are
        off at the initiator)."""
        self._drain()
        with self._lock:
            return self._inbound.pop((remote_key, transfer_uid), None)

    def _drain(self) -> None:
        with self._lock:
            if self._engine is None or self._engine.closed:
                return
            try:
                got = self._engine.pop_notifications(topic=TOPIC)
            except _Error:
                return
            for sender, message in got:
                if len(message) != 9 or message[:1] not in (b"W", b"R"):
                    continue  # not one of ferry.mori's: ignored
                uid = struct.unpack_from("<Q", message, 1)[0]
                self._inbound[(sender, uid)] = TransferStatus(StatusCode.SUCCESS)
                self._inbound.move_to_end((sender, uid))
            while len(self._inbound) > MAX_INBOUND_STATUSES:
                self._inbound.popitem(last=False)

    def __repr__(self):
        return f"IOEngine(key={self._key!r}, backends={[b.name for b in self._backends]})"


def _drain_loop(ref, stop) -> None:
    # Holds the engine only while draining, so that an IOEngine nobody uses can be collected.
    while not stop.wait(_DRAIN_INTERVAL_S):
        engine = ref()
        if engine is None:
            return
        engine._drain()
        del engine
