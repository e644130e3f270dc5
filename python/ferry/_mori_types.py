"""The values of ferry.mori (MoRI-IO's API on ferry): enums, configs and descriptors.

Import them from ferry.mori; this module keeps that one's size reasonable.
"""

import enum
import struct

from . import _ferry

class BackendType(enum.IntEnum):
    Unknown = 0
    XGMI = 1
    RDMA = 2
    TCP = 3
    FABRIC = 4


class MemoryLocationType(enum.IntEnum):
    Unknown = 0
    CPU = 1
    GPU = 2


class StatusCode(enum.IntEnum):
    SUCCESS = 0
    INIT = 1
    IN_PROGRESS = 2
    ERR_INVALID_ARGS = 11
    ERR_NOT_FOUND = 12
    ERR_RDMA_OP = 13
    ERR_BAD_STATE = 14
    ERR_GPU_OP = 15


class PollCqMode(enum.IntEnum):
    POLLING = 0
    EVENT = 1


_ERR_BEGIN = 10
TORCH_DEVICE_TYPE_MAP = {"cpu": MemoryLocationType.CPU, "cuda": MemoryLocationType.GPU}

# ferry's code names -> MoRI-IO's codes. Transport failures (peer gone, deadline, aborted)
# are the transfer operation's failure, MoRI's ERR_RDMA_OP; the message keeps ferry's name.
_CODE_MAP = {
    "OK": StatusCode.SUCCESS,
    "IN_PROGRESS": StatusCode.IN_PROGRESS,
    "INVALID_ARGUMENT": StatusCode.ERR_INVALID_ARGS,
    "OUT_OF_RANGE": StatusCode.ERR_INVALID_ARGS,
    "NOT_FOUND": StatusCode.ERR_NOT_FOUND,
    "FAILED_PRECONDITION": StatusCode.ERR_BAD_STATE,
    "UNSUPPORTED": StatusCode.ERR_BAD_STATE,
}


def _mori_code(name):
    return _CODE_MAP.get(name, StatusCode.ERR_RDMA_OP)


class IOEngineConfig:
    """host: the address ferry's network transport listens on ('' keeps ferry's default,
    127.0.0.1; give the node's IP or '0.0.0.0' for other hosts); port: 0 picks a free one."""

    def __init__(self, host: str = "", port: int = 0):
        self.host, self.port = host, port

    def __repr__(self):
        return f"IOEngineConfig(host={self.host!r}, port={self.port})"


class RdmaBackendConfig:
    """MoRI-IO's RDMA options. ferry applies qp_per_transfer (ucx lanes), post_batch_size
    (post_batch; -1 keeps the default), num_worker_threads (ucx workers; -1 keeps it) and
    poll_cq_mode (ucx progress: POLLING spins a core, as MoRI-IO's) when this is the first
    backend, created before the engine was first used; a FERRY_UCX_* variable that is set
    beats them. enable_notification says whether this engine tells targets of its transfers.
    The chunking and NIC fields are accepted and have no effect (ferry splits on its own)."""

    def __init__(self, qp_per_transfer=1, post_batch_size=-1, num_worker_threads=-1,
                 poll_cq_mode=PollCqMode.POLLING, enable_notification=True, notif_per_qp=1024,
                 enable_transfer_chunking=False, chunk_bytes=65536, max_chunks_per_transfer=64,
                 num_nics_per_transfer=1):
        self.qp_per_transfer, self.post_batch_size = qp_per_transfer, post_batch_size
        self.num_worker_threads, self.poll_cq_mode = num_worker_threads, poll_cq_mode
        self.enable_notification, self.notif_per_qp = enable_notification, notif_per_qp
        self.enable_transfer_chunking, self.chunk_bytes = enable_transfer_chunking, chunk_bytes
        self.max_chunks_per_transfer = max_chunks_per_transfer
        self.num_nics_per_transfer = num_nics_per_transfer
        self.max_send_wr = self.max_cqe_num = self.max_msg_sge = -1

    def _ferry_options(self):
        opts = {"progress": "polling" if self.poll_cq_mode == PollCqMode.POLLING else "event"}
        if self.qp_per_transfer > 0:
            opts["lanes"] = int(self.qp_per_transfer)
        if self.post_batch_size > 0:
            opts["post_batch"] = int(self.post_batch_size)
        if self.num_worker_threads > 0:
            opts["workers"] = int(self.num_worker_threads)
        return opts


class XgmiBackendConfig:
    def __init__(self, num_streams=64, num_events=64):
        self.num_streams, self.num_events = num_streams, num_events


FabricBackendConfig = XgmiBackendConfig


def set_log_level(level: str) -> None:
    """ferry's log level ("trace", "debug", "info", "warn", "error")."""
    _ferry.set_log_level(str(level).lower())


# --- descriptors -------------------------------------------------------------------------
# pack() writes a tag, then each field: strings and bytes as a u32 length and the bytes,
# integers as i64. unpack() checks every length against the bytes present.

_DESC_TAG = b"ferry.mori/1"
_MAX_PACKED = 1 << 20


def _pack_fields(kind: bytes, fields) -> bytes:
    out = [_DESC_TAG, kind]
    for f in fields:
        if isinstance(f, int):
            out.append(b"i" + struct.pack("<q", f))
        else:
            b = f.encode() if isinstance(f, str) else bytes(f)
            out.append(b"b" + struct.pack("<I", len(b)) + b)
    return b"".join(out)


def _unpack_fields(kind: bytes, data, types: str) -> list:
    data = bytes(data)
    head = _DESC_TAG + kind
    if len(data) > _MAX_PACKED or not data.startswith(head):
        raise ValueError(f"not a packed ferry.mori {kind.decode()} descriptor")
    pos, fields = len(head), []
    for t in types:
        if pos >= len(data) or data[pos:pos + 1] != (b"i" if t == "i" else b"b"):
            raise ValueError("truncated or malformed descriptor")
        pos += 1
        if t == "i":
            if pos + 8 > len(data):
                raise ValueError("truncated descriptor")
            fields.append(struct.unpack_from("<q", data, pos)[0])
            pos += 8
            continue
        if pos + 4 > len(data):
            raise ValueError("truncated descriptor")
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if n > len(data) - pos:
            raise ValueError("descriptor field longer than the bytes present")
        raw = data[pos:pos + n]
        pos += n
        try:
            fields.append(raw.decode() if t == "s" else raw)
        except UnicodeDecodeError as e:
            raise ValueError("descriptor string is not UTF-8") from e
    if pos != len(data):
        raise ValueError("trailing bytes after the descriptor")
    return fields


class EngineDesc:
    """One engine (IOEngine.get_engine_desc()), read-only; .ferry is ferry's EngineDesc."""

    def __init__(self, key, node_id, hostname, host, port, pid, ferry_desc):
        self._fields = (key, node_id, hostname, host, port, pid)
        self.ferry = ferry_desc

    key = property(lambda self: self._fields[0])
    node_id = property(lambda self: self._fields[1])
    hostname = property(lambda self: self._fields[2])
    host = property(lambda self: self._fields[3])
    port = property(lambda self: self._fields[4])
    pid = property(lambda self: self._fields[5])

    def pack(self) -> bytes:
        return _pack_fields(b"E", (*self._fields, self.ferry.pack()))

    @staticmethod
    def unpack(packed) -> "EngineDesc":
        f = _unpack_fields(b"E", packed, "ssssiib")
        try:
            inner = _ferry.EngineDesc.unpack(f[6])
        except Exception as e:
            raise ValueError(f"bad ferry engine descriptor inside: {e}") from e
        if inner.key != f[0]:
            raise ValueError("engine key differs from the ferry descriptor's")
        return EngineDesc(*f[:6], inner)

    def __eq__(self, other):
        return isinstance(other, EngineDesc) and self.pack() == other.pack()

    __hash__ = None

    def __repr__(self):
        return f"EngineDesc(key={self.key!r}, host={self.host!r}, port={self.port}, pid={self.pid})"


class MemoryDesc:
    """One registered region, read-only; .ferry is ferry's MemoryDesc (None for MemoryDesc())."""

    def __init__(self, ferry_desc=None, device_bus_id="", numa_node=-1):
        self.ferry = ferry_desc
        self.device_bus_id, self.numa_node, self.ipc_handle = device_bus_id, numa_node, b""

    engine_key = property(lambda self: self.ferry.engine_key if self.ferry else "")
    id = property(lambda self: self.ferry.region if self.ferry else 0)
    device_id = property(lambda self: self.ferry.device if self.ferry else -1)
    data = property(lambda self: self.ferry.address if self.ferry else 0)
    size = property(lambda self: self.ferry.size if self.ferry else 0)

    @property
    def loc(self) -> MemoryLocationType:
        if self.ferry is None:
            return MemoryLocationType.Unknown
        return MemoryLocationType.GPU if self.ferry.kind == "cuda" else MemoryLocationType.CPU

    def pack(self) -> bytes:
        if self.ferry is None:
            raise ValueError("an empty MemoryDesc cannot be packed")
        return _pack_fields(b"M", (self.device_bus_id, self.numa_node, self.ferry.pack()))

    @staticmethod
    def unpack(packed) -> "MemoryDesc":
        bus, numa, inner = _unpack_fields(b"M", packed, "sib")
        try:
            return MemoryDesc(_ferry.MemoryDesc.unpack(inner), bus, numa)
        except Exception as e:
            raise ValueError(f"bad ferry memory descriptor inside: {e}") from e

    def _key(self):
        return (self.engine_key, self.id, self.device_id, self.data, self.size, int(self.loc))

    def __eq__(self, other):  # as MoRI-IO's: the handles are left out
        return isinstance(other, MemoryDesc) and self._key() == other._key()

    __hash__ = None

    def __repr__(self):
        return (f"MemoryDesc(engine_key={self.engine_key!r}, id={self.id}, size={self.size}, "
                f"loc={self.loc.name})")
