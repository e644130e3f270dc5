# The type stub of ferry._ferry, written by tools/packaging/gen_stubs.py from the built module.
# Do not edit: change the bindings' docstrings and run the script again.
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union, overload

import numpy

CODES: tuple

class Engine:
    """ferry's transfer engine: registered memory, peers, sessions.

    Engine(key='', default_deadline_ms=30000, copy_threads=0, ...) takes every field of the
    C++ EngineOptions (ferry/options.h) by keyword: key, default_deadline_ms,
    deregister_timeout_ms, wait_spin_ms, copy_threads, parallel_copy_bytes, pin_host_memory,
    merge_adjacent_ops, transports (names), max_notification_bytes,
    max_pending_notifications, max_pending_notification_bytes,
    max_pending_notifications_per_peer; the ucx transport's
    listen_host, listen_port (default 127.0.0.1, this host only; '0.0.0.0' for every
    interface), max_pending_handshakes, max_connections, handshake_timeout_ms, lanes,
    workers, post_batch, progress ('polling'|'event'|'shared'), rma ('auto'|'always'|
    'never'), max_am_bytes, connect_timeout_ms; the shm transport's revoke_timeout_ms,
    call_timeout_ms, shm_max_connections and shm_allowed_uids (users besides this one whose
    processes may connect; empty: the same user only); metrics_port (0 off, -1 a free port: an HTTP GET /metrics endpoint on
    127.0.0.1, see metrics_port_in_use); secret or secret_file (the deployment's shared
    secret, 16+ bytes: peers over ucx must prove they hold it). A value out of range raises ferry.InvalidArgumentError (a ValueError
    and a ferry.Error with code INVALID_ARGUMENT) naming the field; RESOURCE_EXHAUSTED when a
    thread cannot start. Use as a context manager or call close() to shut it down before it
    is garbage-collected.
    """
    def __enter__(self) -> object: ...
    def __exit__(self, *args) -> None: ...
    @overload
    def __init__(self, **options) -> None:
        """Unset keyword arguments come from the FERRY_* environment variables (docs/configuration.md), then the defaults.
        """
        ...
    @overload
    def __init__(self, *, key: str = '', default_deadline_ms: float = 30000.0, deregister_timeout_ms: Optional[float] = None, copy_threads: int = 0, parallel_copy_bytes: int = 4194304, pin_host_memory: bool = True, merge_adjacent_ops: bool = True, transports: List[str] = [], max_notification_bytes: int = 65536, max_pending_notifications: int = 65536, max_pending_notification_bytes: int = 67108864, listen_host: str = '127.0.0.1', listen_port: int = 0, max_pending_handshakes: int = 64, max_connections: int = 512, handshake_timeout_ms: float = 5000.0, lanes: int = 1, workers: int = 1, post_batch: int = 256, progress: str = 'event', rma: str = 'auto', max_am_bytes: int = 8388608, connect_timeout_ms: float = 10000.0, revoke_timeout_ms: float = 5000.0, call_timeout_ms: float = 10000.0, metrics_port: int = 0, secret: str = '', secret_file: str = '', max_pending_notifications_per_peer: int = 0, shm_max_connections: int = 512, shm_allowed_uids: List[int] = [], wait_spin_ms: float = 2.0) -> None:
        """Unset keyword arguments come from the FERRY_* environment variables (docs/configuration.md), then the defaults.
        """
        ...
    def __repr__(self) -> str: ...
    @overload
    def add_peer(self, peer: EngineDesc) -> None:
        """Adds (or replaces) a peer, from an EngineDesc or its packed bytes.
        """
        ...
    @overload
    def add_peer(self, peer: Any) -> None:
        """Adds (or replaces) a peer, from an EngineDesc or its packed bytes.
        """
        ...
    def allocate_transfer_id(self) -> int:
        """A fresh transfer id, to pass as transfer_id=.
        """
        ...
    def close(self) -> None:
        """Shuts the engine down (its sessions' transfers then fail with ABORTED) and releases
        the buffers it holds. Later calls on the engine raise ferry.Error (ABORTED).
        """
        ...
    @property
    def closed(self) -> bool: ...
    @staticmethod
    def create(**options) -> Engine:
        """Engine.create(**options): the same as Engine(**options).
        """
        ...
    @overload
    def deregister_memory(self, desc: MemoryDesc) -> None:
        """Waits for transfers on the region to end, then deregisters it (later transfers on it
        fail with FAILED_PRECONDITION) and releases the buffer. Raises DEADLINE_EXCEEDED if a
        transfer still uses it then (e.g. one waiting on a stopped peer): the region stays
        registered, retiring, with its buffer held, and a later call retries and frees it.
        """
        ...
    @overload
    def deregister_memory(self, region: int) -> None:
        """Waits for transfers on the region to end, then deregisters it (later transfers on it
        fail with FAILED_PRECONDITION) and releases the buffer. Raises DEADLINE_EXCEEDED if a
        transfer still uses it then (e.g. one waiting on a stopped peer): the region stays
        registered, retiring, with its buffer held, and a later call retries and frees it.
        """
        ...
    def describe(self) -> EngineDesc:
        """This engine's EngineDesc, to hand to peers.
        """
        ...
    def fence_peer(self, key: str, timeout_s: float = 1.0) -> None:
        """Ends the connections peer `key` made to this engine, so nothing it sent before the call
        lands here afterwards (what a consumer does before reusing blocks a silent producer may
        still write). Raises ferry.Error DEADLINE_EXCEEDED when writes were still landing at
        the timeout (call again later).
        """
        ...
    def in_flight(self) -> list:
        """Every transfer still running, oldest first: [{'id', 'peer', 'transport', 'path',
        'bytes', 'age_ms', 'deadline_in_ms' (negative once past; None without one)}].
        """
        ...
    @property
    def key(self) -> str: ...
    def metrics(self, *, format: str = 'dict') -> object:
        """Counters, latency histograms and gauges (ferry/metrics.h). format='dict': {'engine',
        'series': [{'kind': 'transfer'|'notification', 'transport', 'peer', 'results': {code
        name: count}, 'bytes', 'ops', 'latency': {'bounds_seconds', 'counts' (one more than the
        bounds: the last is above them), 'count', 'sum_seconds'}}], 'failures': {cause: count}
        (peer_dead, deadline, rejected, out_of_range, aborted, other), 'transfers_in_flight',
        'peers', 'registered_regions', 'registered_bytes', 'dropped_notifications',
        'rejected_messages', 'auth_failures', 'access_denied', 'connections_refused'};
        format='prometheus': the same as
        Prometheus text.
        """
        ...
    @property
    def metrics_port_in_use(self) -> int: ...
    def notify(self, peer_key: str, message: object, *, topic: str = '') -> None:
        """Sends a small message (bytes, or str sent as UTF-8) to a peer or to this engine, on
        `topic` (at most 64 bytes; '' is the application's): the receiver's
        pop_notifications(topic) returns it, no other topic's.
        """
        ...
    def notify_after(self, peer_key: str, message: object, after: List[Transfer], *, topic: str = '', deadline_ms: Optional[float] = None, transfer_id: Optional[int] = None, on_complete: object = None) -> Transfer:
        """Returns a Transfer that sends `message` to the peer once every transfer in `after`
        (of any sessions of this engine, e.g. one per KV layer) finished OK. If one failed,
        nothing is sent and the returned transfer fails with its error. on_complete as for
        Session.write().
        """
        ...
    def open_session(self, local: MemoryDesc, remote: MemoryDesc) -> Session:
        """A Session from a local region of this engine to a region of a peer (or of this
        engine), over the fastest transport both can use.
        """
        ...
    def pop_notifications(self, *, topic: str = '') -> list:
        """Takes every notification of `topic` ('' by default: the application's) received so
        far: a list of (from_key, bytes). Other topics' notifications stay for their owners.
        """
        ...
    @overload
    def register_memory(self, ptr: int, size: int, *, kind: str = 'host', device: int = -1, owner: object = None, allowed_peers: List[str] = []) -> MemoryDesc:
        """Registers [ptr, ptr + size) of host (kind="host") or CUDA memory (kind="cuda",
        device=ordinal). The memory must stay valid until deregistered; pass `owner` to keep
        an object alive that long. `allowed_peers`: engine keys of the only peers that may
        reach the region (empty: every peer); others are refused with PERMISSION_DENIED.
        Returns a MemoryDesc.

        Registers the memory of a writable, C-contiguous buffer (a numpy array, bytearray,
        ...) as host memory; the buffer is held until deregistered. `allowed_peers`: engine
        keys of the only peers that may reach the region (empty: every peer). Returns a
        MemoryDesc.
        """
        ...
    @overload
    def register_memory(self, buffer: Any, *, allowed_peers: List[str] = []) -> MemoryDesc:
        """Registers [ptr, ptr + size) of host (kind="host") or CUDA memory (kind="cuda",
        device=ordinal). The memory must stay valid until deregistered; pass `owner` to keep
        an object alive that long. `allowed_peers`: engine keys of the only peers that may
        reach the region (empty: every peer); others are refused with PERMISSION_DENIED.
        Returns a MemoryDesc.

        Registers the memory of a writable, C-contiguous buffer (a numpy array, bytearray,
        ...) as host memory; the buffer is held until deregistered. `allowed_peers`: engine
        keys of the only peers that may reach the region (empty: every peer). Returns a
        MemoryDesc.
        """
        ...
    def register_tensor(self, tensor, *, allowed_peers: 'list[str] | None' = None) -> MemoryDesc:
        """Registers the memory of a contiguous torch tensor, on the CPU or on a CUDA device.

        Uses tensor.data_ptr(), numel() * element_size() and tensor.device; the tensor is kept
        alive until the region is deregistered. torch is not needed to import ferry.
        `allowed_peers`: engine keys of the only peers that may reach the region (None or empty:
        every peer), as for register_memory.
        """
        ...
    def remove_peer(self, key: str) -> None:
        """Forgets a peer by key.
        """
        ...
    def stats(self) -> dict:
        """Counters: {'rejected_messages': malformed or out-of-bounds messages from peers,
        'auth_failures': connections refused for want of a proof of the secret,
        'access_denied': requests for a region by a peer not on its access list,
        'connections_refused': connections refused for want of room (max_connections, pending
        handshakes),
        'dropped_notifications': notifications refused here (backlog full, too big),
        'merged_ops': ops of posted batches that travelled as part of the op before them,
        'gpu_kernel_launches', 'gpu_kernel_pieces', 'gpu_dma_calls', 'gpu_dma_copies': the GPU
        copies the engine enqueued: copy kernel launches and their pieces, DMA calls and their copies}.
        """
        ...
    @property
    def transports(self) -> List[str]: ...

class EngineDesc:
    """One engine, as a value that can travel to peers (Engine.describe()).

    pack() gives bytes, EngineDesc.unpack(bytes) reads them back.
    """
    def __eq__(self, arg0: EngineDesc) -> bool: ...
    def __repr__(self) -> str: ...
    @property
    def addresses(self) -> List[str]: ...
    @property
    def host_id(self) -> str: ...
    @property
    def key(self) -> str: ...
    def pack(self) -> bytes:
        """The versioned msgpack encoding, as bytes.
        """
        ...
    @property
    def pid(self) -> int: ...
    @property
    def protocol_version(self) -> int: ...
    @property
    def transports(self) -> list: ...
    @staticmethod
    def unpack(packed: object) -> EngineDesc:
        """Decodes pack()'s bytes; raises ferry.Error on truncated or malformed input.
        """
        ...
MAX_DESCRIPTOR_BYTES: int

class MemoryDesc:
    """One registered memory region, as a value that can travel to peers.

    Made by Engine.register_memory(); pack() gives bytes, MemoryDesc.unpack(bytes) reads them back.
    """
    def __eq__(self, arg0: MemoryDesc) -> bool: ...
    def __repr__(self) -> str: ...
    @property
    def access(self) -> list: ...
    @property
    def address(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def engine_key(self) -> str: ...
    @property
    def host_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    def pack(self) -> bytes:
        """The versioned msgpack encoding, as bytes.
        """
        ...
    @property
    def region(self) -> int: ...
    @property
    def size(self) -> int: ...
    @staticmethod
    def unpack(packed: object) -> MemoryDesc:
        """Decodes pack()'s bytes; raises ferry.Error on truncated or malformed input.
        """
        ...
PROTOCOL_VERSION: int

class Session:
    """A route from one local region to one remote region (Engine.open_session()).
    """
    def __repr__(self) -> str: ...
    @property
    def connected(self) -> bool: ...
    @property
    def local(self) -> MemoryDesc: ...
    @property
    def path(self) -> TransferPath: ...
    def read(self, local_offset: int, remote_offset: int, size: int, *, deadline_ms: Optional[float] = None, notification: Optional[str] = None, transfer_id: Optional[int] = None, notification_topic: str = '', after: Optional[List[Transfer]] = None, on_complete: object = None) -> Transfer:
        """Posts a read of `size` bytes from remote[remote_offset:] to local[local_offset:].

        deadline_ms, transfer_id, after and on_complete as for write(); reads carry no
        notification. Errors are reported by the returned Transfer.
        """
        ...
    def read_batch(self, ops: object, *, deadline_ms: Optional[float] = None, notification: Optional[str] = None, transfer_id: Optional[int] = None, notification_topic: str = '', after: Optional[List[Transfer]] = None, on_complete: object = None) -> Transfer:
        """Posts a batch as one transfer. ops: a list of (local_offset, remote_offset, size)
        tuples, or an integer array of shape (n, 3) of any integer dtype (numpy's int64,
        uint64, int32, ...; negative values refused; copied when posted). If any op
        is out of range the whole batch fails with OUT_OF_RANGE before any byte moves. Options
        as for write() and read().
        """
        ...
    @property
    def remote(self) -> MemoryDesc: ...
    def write(self, local_offset: int, remote_offset: int, size: int, *, deadline_ms: Optional[float] = None, notification: Optional[str] = None, transfer_id: Optional[int] = None, notification_topic: str = '', after: Optional[List[Transfer]] = None, on_complete: object = None) -> Transfer:
        """Posts a write of `size` bytes from local[local_offset:] to remote[remote_offset:].

        deadline_ms overrides the engine's default deadline; notification (bytes or str) is
        delivered to the remote engine after the data is in place, on notification_topic ('' by
        default; the receiver's pop_notifications(topic=...)); transfer_id sets the id.
        after=[transfers]: this transfer finishes (and its notification leaves) only once each of
        them finished OK (any session of the engine); if one failed, it fails with that error and
        no notification is sent. on_complete=fn: fn(code, message) is called once when the
        transfer ends, with the GIL acquired, on the engine's completion thread (or at once on
        this thread if the transfer was refused); it may post transfers, and should be short.
        Errors (e.g. OUT_OF_RANGE) are reported by the returned Transfer.
        """
        ...
    def write_batch(self, ops: object, *, deadline_ms: Optional[float] = None, notification: Optional[str] = None, transfer_id: Optional[int] = None, notification_topic: str = '', after: Optional[List[Transfer]] = None, on_complete: object = None) -> Transfer:
        """Posts a batch as one transfer. ops: a list of (local_offset, remote_offset, size)
        tuples, or an integer array of shape (n, 3) of any integer dtype (numpy's int64,
        uint64, int32, ...; negative values refused; copied when posted). If any op
        is out of range the whole batch fails with OUT_OF_RANGE before any byte moves. Options
        as for write() and read().
        """
        ...

class Transfer:
    """A posted read or write (single or batch); completes asynchronously.
    """
    def __repr__(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def id(self) -> int: ...
    @property
    def path(self) -> TransferPath: ...
    def status(self) -> tuple:
        """(code, message): ("IN_PROGRESS", ...) while running, ("OK", "") on success.
        """
        ...
    def succeeded(self) -> bool:
        """True once finished successfully. Never blocks.
        """
        ...
    def test(self) -> bool:
        """True once finished, successfully or not. Never blocks.
        """
        ...
    def wait(self, timeout_ms: Optional[float] = None) -> bool:
        """Blocks (without the GIL) until the transfer finishes or its deadline passes.

        Returns True on success, False if timeout_ms elapsed first (the transfer keeps
        running); raises ferry.Error if the transfer failed.
        """
        ...

class TransferPath:
    """How a transfer travels: transport and staging.
    """
    def __eq__(self, arg0: TransferPath) -> bool: ...
    def __repr__(self) -> str: ...
    @property
    def staged(self) -> bool: ...
    @property
    def transport(self) -> str: ...
def _env_engine_kwargs() -> dict:
    """Engine()'s keyword arguments from the FERRY_* variables (docs/configuration.md).
    """
    ...
def _log_to_python(logger_name: Optional[str]) -> None:
    """Sends ferry's messages to logging.getLogger(name); None: back to stderr.
    """
    ...
def _set_error_class(arg0: object) -> None:
    """Sets the exception class raised for a failed Status (called by ferry/__init__.py).
    """
    ...
def _set_invalid_argument_class(arg0: object) -> None:
    """Sets the class raised for INVALID_ARGUMENT (called by ferry/__init__.py).
    """
    ...
def alloc_shared(nbytes: int) -> numpy.ndarray:
    """Zeroed host memory of `nbytes` that peers on this host can map (the shm transport), as a numpy uint8 array that owns it.
    """
    ...
def cuda_available() -> bool:
    """True when CUDA memory can be registered here.
    """
    ...
def cuda_unavailable_reason() -> str:
    """Why CUDA memory cannot be registered here (empty when it can).
    """
    ...
def get_log_level() -> str:
    """ferry's log level, by name.
    """
    ...
def set_log_level(level: str) -> None:
    """Sets ferry's log level: 'trace', 'debug', 'info', 'warn', 'error' or 'off' (FERRY_LOG sets
    the first one). An unknown name raises ferry.InvalidArgumentError.
    """
    ...
def system_info() -> dict:
    """What this build can do here: version, transports compiled and usable, CUDA state, GPUs.
    """
    ...
def version() -> str:
    """ferry's version, "MAJOR.MINOR.PATCH".
    """
    ...
def wait_all(transfers: List[Transfer], *, timeout_ms: Optional[float] = None) -> bool:
    """Blocks (without the GIL) until every transfer finished. True when all succeeded; raises
    the first failure (in finishing order) as soon as one fails; False if timeout_ms passed
    first. Bounded by the earliest deadline among them (DEADLINE_EXCEEDED).
    """
    ...
def wait_any(transfers: List[Transfer], *, timeout_ms: Optional[float] = None) -> Optional[int]:
    """Blocks (without the GIL) until one transfer finished and returns its index (the lowest
    when several have; check its status); None if timeout_ms passed first. Raises
    DEADLINE_EXCEEDED when the earliest deadline among them passes with none finished
    (that transfer has then failed), INVALID_ARGUMENT for an empty list.
    """
    ...


class kv:
    """The KV-cache connector (ferry/kv.h); use ferry.kv.
    """

    class CacheLayout:
        """A worker's KV cache: the model's identity (model, dtype_bytes, head_dim, total_kv_heads,
        mla, num_layers: these must agree between peers), its TP/DP slice, block sizes, the
        regions' sizes and every layer's K/V placement. make_layout() fills region_bytes and
        layers for the standard tensor orders; ferry.kv.register_kv_caches() reads them from
        tensors. List fields (region_bytes, layers) are copies: assign a whole list to change them.
        """
        def __eq__(self, arg0: CacheLayout) -> bool: ...
        def __init__(self, *, model: str = '', dtype_bytes: int = 2, head_dim: int = 0, total_kv_heads: int = 0, mla: bool = False, num_layers: int = 0, tp_rank: int = 0, tp_size: int = 1, dp_rank: int = 0, block_tokens: int = 16, kernel_block_tokens: int = 0, num_blocks: int = 0, region_bytes: List[int] = [], layers: List[LayerLayout] = []) -> None: ...
        def __repr__(self) -> str: ...
        @property
        def block_tokens(self) -> int: ...
        @block_tokens.setter
        def block_tokens(self, value: int) -> None: ...
        def compatibility_hash(self) -> int: ...
        def copy(self) -> CacheLayout: ...
        @property
        def dp_rank(self) -> int: ...
        @dp_rank.setter
        def dp_rank(self, value: int) -> None: ...
        @property
        def dtype_bytes(self) -> int: ...
        @dtype_bytes.setter
        def dtype_bytes(self, value: int) -> None: ...
        @property
        def first_head(self) -> int: ...
        @property
        def head_bytes(self) -> int: ...
        @property
        def head_dim(self) -> int: ...
        @head_dim.setter
        def head_dim(self, value: int) -> None: ...
        @property
        def heads(self) -> int: ...
        @property
        def kernel_block(self) -> int: ...
        @property
        def kernel_block_tokens(self) -> int: ...
        @kernel_block_tokens.setter
        def kernel_block_tokens(self, value: int) -> None: ...
        @property
        def layers(self) -> List[LayerLayout]: ...
        @layers.setter
        def layers(self, value: List[LayerLayout]) -> None: ...
        @property
        def mla(self) -> bool: ...
        @mla.setter
        def mla(self, value: bool) -> None: ...
        @property
        def model(self) -> str: ...
        @model.setter
        def model(self, value: str) -> None: ...
        @property
        def num_blocks(self) -> int: ...
        @num_blocks.setter
        def num_blocks(self, value: int) -> None: ...
        @property
        def num_layers(self) -> int: ...
        @num_layers.setter
        def num_layers(self, value: int) -> None: ...
        def pack(self) -> bytes:
            """The versioned msgpack encoding, as bytes.
            """
            ...
        @property
        def region_bytes(self) -> List[int]: ...
        @region_bytes.setter
        def region_bytes(self, value: List[int]) -> None: ...
        @property
        def total_kv_heads(self) -> int: ...
        @total_kv_heads.setter
        def total_kv_heads(self, value: int) -> None: ...
        @property
        def tp_rank(self) -> int: ...
        @tp_rank.setter
        def tp_rank(self, value: int) -> None: ...
        @property
        def tp_size(self) -> int: ...
        @tp_size.setter
        def tp_size(self, value: int) -> None: ...
        @staticmethod
        def unpack(packed: object) -> CacheLayout:
            """Decodes pack()'s bytes; raises ferry.Error on malformed input.
            """
            ...
        def validate(self) -> None:
            """Raises InvalidArgumentError naming the field (and layer) that is out of bounds.
            """
            ...

    class Connector:
        """One worker's KV connector: moves requests' KV blocks to and from peer workers.

        Connector(engine, layout, regions, *, instance, role='both', mode='write',
        deferred_write_timeout_ms=60000, transfer_timeout_ms=30000, abort_timeout_ms=480000,
        liveness_interval_ms=1000, checksums=False, handshake_timeout_ms=5000, eager_connect=False,
        busy_poll=False):
        `regions` are the
        engine's MemoryDescs of the layout's regions, in order (ferry.kv.register_kv_caches builds
        all three from tensors). Every call releases the GIL. Requests end on each side exactly
        once (pop_finished / wait_finished). close() (or leaving a `with` block) stops it.
        """
        def __enter__(self) -> object: ...
        def __exit__(self, *args) -> None: ...
        def __init__(self, engine: object, layout: CacheLayout, regions: List[MemoryDesc], *, instance: str, role: str = 'both', mode: str = 'write', deferred_write_timeout_ms: float = 60000.0, transfer_timeout_ms: float = 30000.0, abort_timeout_ms: float = 480000.0, liveness_interval_ms: float = 1000.0, checksums: bool = False, handshake_timeout_ms: float = 5000.0, eager_connect: bool = False, busy_poll: bool = False) -> None: ...
        def __repr__(self) -> str: ...
        def abort(self, request: str) -> None:
            """Gives up on `request`; it ends ("aborted") once no peer can touch its blocks.
            """
            ...
        def add_peer(self, metadata: object) -> None:
            """Learns a peer worker from its metadata() bytes. Raises InvalidArgumentError naming the
            first field that must agree and does not ("head_dim: 128 vs 64"). A worker learnt again
            under another engine (its process restarted) replaces the one before; the connections to
            its old engine are let go once they are found dead.
            """
            ...
        def add_peer_from(self, address: str) -> None:
            """Fetches a peer's metadata from its serve_handshake() address, then add_peer().
            """
            ...
        def close(self) -> None:
            """Stops the connector (pending requests end; later calls raise ferry.Error ABORTED).
            """
            ...
        @property
        def closed(self) -> bool: ...
        @property
        def engine(self) -> object: ...
        def expect_write(self, request: str, producer: str, producer_dp: int, blocks: object, num_tokens: int = 0, first_token: int = 0) -> None:
            """Consumer, write mode: `blocks` (a list or integer array of block ids) wait for the KV of
            `request` from instance `producer`, DP rank producer_dp. num_tokens: 0 = as many as the
            blocks hold; first_token: the first token that moves after a prefix hit.
            """
            ...
        def hold_for_read(self, request: str, blocks: object, num_tokens: int = 0) -> ReadParams:
            """Producer, read mode: keeps `blocks` until the consumer releases them; returns the
            ReadParams (pack() them for the router) that the consumer's start_read takes.
            """
            ...
        @property
        def id(self) -> WorkerId: ...
        @property
        def layout(self) -> CacheLayout: ...
        def metadata(self) -> bytes:
            """This worker's packed WorkerMetadata (bytes), for peers' add_peer().
            """
            ...
        @property
        def pending(self) -> int: ...
        def pop_finished(self) -> List[Finished]:
            """The requests (Finished) that ended since the last call, on either side.
            """
            ...
        def save_layer(self, request: str, layer: int, blocks: object, ready: object = None) -> None:
            """Producer, write mode: `layer` of `request` (source `blocks`) is computed once `ready`
            says so, and is written as soon as the consumer's allocation is known. `ready` is None
            (ready now), an object with .synchronize() (a torch.cuda.Event or Stream: called) or a
            callable ready(timeout_ms) that returns truthy or None when ready, falsy when not ready
            in time, or raises (the request fails). It is called on ferry's ready thread, not the
            caller's, with the GIL held, one save at a time in the order they were made: keep it
            short and do not wait in it for the thread that called save_layer.
            """
            ...
        def seal(self, request: str, layers_saved: int) -> None:
            """Producer, write mode: `request` saved layers_saved layers and no more will come.
            """
            ...
        def serve_handshake(self, host: str = '127.0.0.1', port: int = 0) -> str:
            """Serves metadata() on host:port (0: a free port); returns "host:port".
            """
            ...
        def start_read(self, params: object, blocks: object, first_token: int = 0) -> None:
            """Consumer, read mode: reads every layer of the request of `params` (a ReadParams or its
            pack() bytes, from the producer's hold_for_read) into `blocks`.
            """
            ...
        def stats(self) -> dict:
            """Counters, as a dict: requests_done, requests_failed, requests_aborted, layers_written,
            layers_read, layers_deferred, bytes, ops_posted, messages_sent, messages_received,
            messages_rejected, blocks_expired, checksum_failures, peers_lost, peers_fenced.
            """
            ...
        def wait_finished(self, timeout_ms: float) -> List[Finished]:
            """Waits until a request ended or timeout_ms passed; then as pop_finished() (maybe []).
            """
            ...
        def wait_layer(self, request: str, layer: int, timeout_ms: float) -> None:
            """Read mode: returns once `layer` of `request` landed. Raises the request's error if it
            failed, DEADLINE_EXCEEDED when timeout_ms passed, NOT_FOUND for a request not pending.
            """
            ...

    class Finished:
        """A request that ended on this side; its blocks are the caller's again.
        """
        def __repr__(self) -> str: ...
        @property
        def at_ns(self) -> int: ...
        @property
        def blocks(self) -> List[int]: ...
        @property
        def code(self) -> str: ...
        @property
        def message(self) -> str: ...
        @property
        def outcome(self) -> str: ...
        @property
        def producer(self) -> bool: ...
        @property
        def request(self) -> str: ...
    KV_VERSION: int

    class LayerLayout:
        """One layer: K and V (v is None for MLA).
        """
        def __eq__(self, arg0: LayerLayout) -> bool: ...
        def __init__(self, k: TensorLayout, v: Optional[TensorLayout] = None) -> None: ...
        def __repr__(self) -> str: ...
        @property
        def k(self) -> TensorLayout: ...
        @k.setter
        def k(self, value: TensorLayout) -> None: ...
        @property
        def v(self) -> Optional[TensorLayout]: ...
        @v.setter
        def v(self, value: Optional[TensorLayout]) -> None: ...
    MAX_HEADS: int
    MAX_LAYERS: int
    MAX_REGIONS: int
    MAX_TP_SIZE: int

    class ReadParams:
        """What a producer's hold_for_read() returns, for the router to pass to
        the consumer's start_read() (as pack() bytes, or pickled).
        """
        def __eq__(self, arg0: ReadParams) -> bool: ...
        def __init__(self, *, request: str = '', producer: WorkerId = ..., producer_tp_size: int = 1, handshake: str = '', blocks: List[int] = [], num_tokens: int = 0) -> None: ...
        def __repr__(self) -> str: ...
        @property
        def blocks(self) -> List[int]: ...
        @blocks.setter
        def blocks(self, value: List[int]) -> None: ...
        @property
        def handshake(self) -> str: ...
        @handshake.setter
        def handshake(self, value: str) -> None: ...
        @property
        def num_tokens(self) -> int: ...
        @num_tokens.setter
        def num_tokens(self, value: int) -> None: ...
        def pack(self) -> bytes:
            """The versioned msgpack encoding, as bytes.
            """
            ...
        @property
        def producer(self) -> WorkerId: ...
        @producer.setter
        def producer(self, value: WorkerId) -> None: ...
        @property
        def producer_tp_size(self) -> int: ...
        @producer_tp_size.setter
        def producer_tp_size(self, value: int) -> None: ...
        @property
        def request(self) -> str: ...
        @request.setter
        def request(self, value: str) -> None: ...
        @staticmethod
        def unpack(packed: object) -> ReadParams:
            """Decodes pack()'s bytes; raises ferry.Error on malformed input.
            """
            ...
    TENSOR_ORDERS: tuple
    TOPIC: str

    class TensorLayout:
        """Where one tensor (K, V or an MLA latent) of one layer lives in a region, as byte
        strides: (kernel block b, token t, local head h, byte i) is at offset +
        b * block_stride + t * token_stride + h * head_stride + i.
        """
        def __eq__(self, arg0: TensorLayout) -> bool: ...
        def __init__(self, *, region: int = 0, offset: int = 0, block_stride: int = 0, token_stride: int = 0, head_stride: int = 0) -> None: ...
        def __repr__(self) -> str: ...
        @property
        def block_stride(self) -> int: ...
        @block_stride.setter
        def block_stride(self, value: int) -> None: ...
        @property
        def head_stride(self) -> int: ...
        @head_stride.setter
        def head_stride(self, value: int) -> None: ...
        @property
        def offset(self) -> int: ...
        @offset.setter
        def offset(self, value: int) -> None: ...
        @property
        def region(self) -> int: ...
        @region.setter
        def region(self, value: int) -> None: ...
        @property
        def token_stride(self) -> int: ...
        @token_stride.setter
        def token_stride(self, value: int) -> None: ...

    class WorkerId:
        """A worker's name: its instance, DP rank and TP rank.
        """
        def __eq__(self, arg0: WorkerId) -> bool: ...
        def __init__(self, instance: str = '', dp_rank: int = 0, tp_rank: int = 0) -> None: ...
        def __repr__(self) -> str: ...
        @property
        def dp_rank(self) -> int: ...
        @dp_rank.setter
        def dp_rank(self, value: int) -> None: ...
        @property
        def instance(self) -> str: ...
        @instance.setter
        def instance(self, value: str) -> None: ...
        @property
        def tp_rank(self) -> int: ...
        @tp_rank.setter
        def tp_rank(self, value: int) -> None: ...

    class WorkerMetadata:
        """What a worker tells its peers (Connector.metadata(), unpacked).
        """
        def __repr__(self) -> str: ...
        @property
        def compatibility_hash(self) -> int: ...
        @property
        def engine(self) -> EngineDesc: ...
        @property
        def id(self) -> WorkerId: ...
        @property
        def layout(self) -> CacheLayout: ...
        def pack(self) -> bytes:
            """The versioned msgpack encoding, as bytes.
            """
            ...
        @property
        def regions(self) -> List[MemoryDesc]: ...
        @staticmethod
        def unpack(packed: object) -> WorkerMetadata:
            """Decodes pack()'s bytes; raises ferry.Error on malformed input.
            """
            ...
        @property
        def version(self) -> int: ...
    @staticmethod
    def check_compatible(a: CacheLayout, b: CacheLayout) -> None:
        """Returns when a producer and a consumer of these layouts may exchange KV; otherwise raises
        InvalidArgumentError naming the first field that differs ("head_dim: 128 vs 64").
        """
        ...
    @staticmethod
    def make_layout(layout: CacheLayout, order: str, *, one_region: bool = False) -> CacheLayout:
        """A copy of `layout` (identity fields set) with region_bytes and layers filled for `order`
        (one of TENSOR_ORDERS): one region per layer (per tensor for 'separate*'), or every layer
        in one region when one_region. Validated.
        """
        ...


class embed:
    """The embedding-offload core: row ids, tables, gathers.
    """

    class Config:
        """The n-gram embedding configuration (see ferry/embed.h).
        """
        def __init__(self, *, vocab_size: int, eos_id: int, ngram_size: int, heads_per_ngram: int, embed_dim: int, base_vocab: int, row_padding: int = 128, seed: int = 1234, layer: int = 0) -> None: ...
        def __repr__(self) -> str: ...
        @property
        def base_vocab(self) -> int: ...
        @base_vocab.setter
        def base_vocab(self, value: int) -> None: ...
        @property
        def embed_dim(self) -> int: ...
        @embed_dim.setter
        def embed_dim(self, value: int) -> None: ...
        @property
        def eos_id(self) -> int: ...
        @eos_id.setter
        def eos_id(self, value: int) -> None: ...
        @property
        def heads_per_ngram(self) -> int: ...
        @heads_per_ngram.setter
        def heads_per_ngram(self, value: int) -> None: ...
        @property
        def layer(self) -> int: ...
        @layer.setter
        def layer(self, value: int) -> None: ...
        @staticmethod
        def model(eos_id: int, layer: int = 0) -> Config:
            """The model's configuration: V 248320, N 3, H 8, E 2560, B 2e7, P 128, S 1234.
            """
            ...
        @property
        def ngram_size(self) -> int: ...
        @ngram_size.setter
        def ngram_size(self, value: int) -> None: ...
        @property
        def row_padding(self) -> int: ...
        @row_padding.setter
        def row_padding(self, value: int) -> None: ...
        @property
        def seed(self) -> int: ...
        @seed.setter
        def seed(self, value: int) -> None: ...
        @property
        def vocab_size(self) -> int: ...
        @vocab_size.setter
        def vocab_size(self, value: int) -> None: ...

    class Gatherer:
        """Gathers a step's rows with a pool of threads.
        """
        def __init__(self, threads: int = 1, chunk_tokens: int = 32, prefetch_rows: int = 32) -> None: ...
        def gather(self, table: Table, row_ids: numpy.ndarray, out: numpy.ndarray) -> None:
            """Writes the rows of row_ids ([T, G] uint64) into out (T x G x row_bytes bytes).
            """
            ...
        def gather_step(self, layout: Layout, table: Table, tokens: Any, query_start_loc: Any, ngram_context: Any, out: numpy.ndarray) -> None:
            """Computes a step's row ids and writes its rows into out ([T, E] values).
            """
            ...

    class Layout:
        """Multipliers, head sizes and offsets derived from a Config.
        """
        def __init__(self, config: Config) -> None: ...
        @property
        def config(self) -> Config: ...
        @property
        def head_dim(self) -> int: ...
        @property
        def head_offsets(self) -> List[int]: ...
        @property
        def head_sizes(self) -> List[int]: ...
        @property
        def multipliers(self) -> List[int]: ...
        @property
        def ngram_size(self) -> int: ...
        @property
        def num_heads(self) -> int: ...
        def row_ids(self, tokens: Any, query_start_loc: Any, ngram_context: Any, threads: int = 1) -> numpy.ndarray:
            """Row ids [num_tokens, G] (uint64; PADDING_ROW for tokens past the last request).
            """
            ...
        @property
        def table_rows(self) -> int: ...
        @property
        def used_rows(self) -> int: ...
    PADDING_ROW: int

    class Table:
        """Embedding rows in host memory.
        """
        def array(self) -> numpy.ndarray:
            """A read-only uint8 view [rows, row_bytes] of the rows (no copy; keeps the table alive).
            """
            ...
        @property
        def dtype(self) -> str: ...
        @property
        def nbytes(self) -> int: ...
        @property
        def num_segments(self) -> int: ...
        @staticmethod
        def open(layout: Layout, paths: List[str], tensor_name: str = '', populate: bool = False) -> Table:
            """Memory-maps the table from safetensors files.
            """
            ...
        def row(self, row: int) -> bytes:
            """The bytes of one row.
            """
            ...
        @property
        def row_bytes(self) -> int: ...
        @property
        def rows(self) -> int: ...
        @staticmethod
        def synthetic(layout: Layout, dtype: str = 'bf16', rows: int = 0, threads: int = 1) -> Table:
            """A table filled with synthetic_row(r) (rows 0: the layout's).
            """
            ...
    @staticmethod
    def synthetic_row(row: int, row_bytes: int) -> bytes:
        """The synthetic table's bytes of one row.
        """
        ...


class embed_service:
    """The embedding-offload client: shared inputs, outputs, flags, waits.
    """

    class Client:
        """One GPU worker's connection to `ferry embed-serve` (host-mode outputs).
        """
        def __init__(self, socket_path: str, *, dp_rank: int = 0, tp_rank: int = 0, tp_size: int = 1, max_tokens: int, max_reqs: int, context_len: int, token_bytes: int, layers: List[int], connect_timeout_ms: float = 10000.0, step_timeout_ms: float = 30000.0, mode: str = 'host', device: int = 0, cuda_outputs: List[int] = [], cuda_flags: List[int] = []) -> None: ...
        def close(self) -> None: ...
        def device_flag(self, slot: int) -> int: ...
        def device_output(self, slot: int) -> int:
            """CUDA mode: the slot's output's device address (0 in host mode)
            """
            ...
        def flag(self, slot: int) -> int: ...
        @property
        def input_ids(self) -> numpy.ndarray: ...
        @property
        def layers(self) -> List[int]: ...
        @property
        def ngram_context(self) -> numpy.ndarray: ...
        def output(self, slot: int) -> numpy.ndarray:
            """The slot's output rows: uint8 [max_tokens, token_bytes]
            """
            ...
        def prepare_forward(self, num_reqs: int, num_tokens: int, dummy: bool = False, stream: int = 0, sources: Optional[Tuple[int, int, int]] = None) -> None:
            """stream: a CUDA stream handle (torch's .cuda_stream); sources: device addresses of (input ids, query start locations, n-gram context) to copy on it
            """
            ...
        @property
        def query_start_loc(self) -> numpy.ndarray: ...
        def release_outputs(self, stream: int = 0) -> None: ...
        @property
        def slots(self) -> int: ...
        def wait(self, slot: int, stream: int = 0) -> None: ...
    FLAG_DONE: int
    FLAG_FAILED: int
    FLAG_RESET: int
    PROTOCOL_VERSION: int
