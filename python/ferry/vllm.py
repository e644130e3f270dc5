"""ferry.vllm: a vLLM KV connector (KVConnectorBase_V1) built on ferry.kv.

vLLM loads it with::

    --kv-transfer-config '{"kv_connector": "FerryConnector", "kv_connector_module_path": "ferry.vllm",
                           "kv_role": "kv_both", "kv_connector_extra_config": {"mode": "write"}}'

vLLM builds the class twice: with role SCHEDULER in the engine-core process (bookkeeping only:
no memory, no threads, nothing that blocks) and with role WORKER in each GPU worker (a
ferry.Engine and a ferry.kv.Connector over the KV cache, and a handshake endpoint at
handshake_port + dp_rank * tp_size + tp_rank). The two talk only through the metadata objects
that vLLM passes (and pickles) from one to the other, so they work in one process or two.

Modes (kv_connector_extra_config "mode"):
  write: the prefill (P) pushes each layer as it is computed (save_kv_layer); the decode (D)
    loads asynchronously (the request waits in WAITING_FOR_REMOTE_KVS until get_finished names
    it). D's allocation may reach P before or after P computed the layers.
  read: P holds its blocks after the prefill; D reads them in the step that schedules the
    request, layer by layer (wait_for_layer_load is a real barrier), then releases them.

Peers find each other through kv_transfer_params, as vLLM's routers pass them: P's
request_finished returns {do_remote_prefill, remote_engine_id, remote_host, remote_port,
remote_dp_rank, remote_tp_size, remote_block_ids, transfer_id, ...}; the router puts that dict in
D's request. A router that sends to P and D at once gives both the same transfer_id and gives D
P's remote_engine_id/host/port (write mode only). A transfer that fails (P gone, aborted, timed
out, checksum) reports D's blocks through get_block_ids_with_load_errors, for vLLM's
kv_load_failure_policy; nothing waits past the connector's timeouts.
"""

import logging
from dataclasses import dataclass, field

log = logging.getLogger("ferry.vllm")

try:  # where vLLM is installed, its own classes; elsewhere stand-ins of the same shape
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                                   KVConnectorRole)
except ImportError:  # pragma: no cover - depends on the environment
    import enum

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        """What the scheduler side sends the workers each step."""

    class KVConnectorBase_V1:
        """The part of vLLM's base class the connector relies on."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            self._vllm_config, self._role, self._kv_cache_config = vllm_config, role, kv_cache_config
            self._connector_metadata = None

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            return self._connector_metadata

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats as _StatsBase
except ImportError:  # pragma: no cover - depends on the environment
    @dataclass
    class _StatsBase:
        data: dict = field(default_factory=dict)

__all__ = ["FerryConnector", "FerryConnectorMetadata", "FerryKVConnectorStats", "KVConnectorRole", "Load", "Save"]

# Request statuses that end a prefill normally (P hands its KV on only then).
_NORMAL_ENDS = ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")
# Keys of kv_connector_extra_config passed to the ferry.kv Connector as they are.
_CONNECTOR_OPTIONS = ("transfer_timeout_ms", "deferred_write_timeout_ms", "abort_timeout_ms", "liveness_interval_ms",
                      "checksums", "handshake_timeout_ms", "eager_connect", "busy_poll")
_ROLES = {"kv_producer": "producer", "kv_consumer": "consumer", "kv_both": "both"}


@dataclass
class Load:
    """D: move request `req_id`'s KV (transfer `tid`) from P into `blocks` (tokens from
    first_token on); notify_only: a full prefix hit, P is only told to free its blocks."""

    req_id: str
    tid: str
    blocks: list
    first_token: int
    num_tokens: int
    engine: str
    dp_rank: int
    tp_size: int
    host: str
    port: int
    remote_blocks: list = field(default_factory=list)  # read mode: P's blocks
    remote_tokens: int = 0  # read mode: the tokens P holds
    notify_only: bool = False


@dataclass
class Save:
    """P: request `req_id`'s prefill ends this step; its KV (transfer `tid`) is in `blocks`."""

    req_id: str
    tid: str
    blocks: list
    num_tokens: int


@dataclass
class FerryConnectorMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)     # [Load]
    saves: list = field(default_factory=list)     # [Save]
    aborts: list = field(default_factory=list)    # [(req_id, tid)]: give up on these transfers
    released: list = field(default_factory=list)  # [(req_id, tid)]: vLLM finished them, blocks held


@dataclass
class FerryKVConnectorStats(_StatsBase):
    """Counters of one worker (or several, aggregated): transfers, failures, bytes, latency."""

    def __post_init__(self):
        if not self.data:
            self.reset()

    def reset(self):
        self.data = {"num_successful_transfers": 0, "num_failed_transfers": 0, "bytes_transferred": 0,
                     "num_kv_expired_blocks": 0, "transfer_ms": []}

    def is_empty(self) -> bool:
        return self.data["num_successful_transfers"] == 0 and self.data["num_failed_transfers"] == 0

    def aggregate(self, other):
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, [] if isinstance(v, list) else 0) + v
        return self

    def reduce(self) -> dict:
        ms = sorted(self.data["transfer_ms"])
        out = {k: v for k, v in self.data.items() if k != "transfer_ms"}
        out["avg_transfer_ms"] = round(sum(ms) / len(ms), 3) if ms else 0.0
        out["p90_transfer_ms"] = round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 3) if ms else 0.0
        return out


def _config(vllm_config):
    """(kv_transfer_config, its extra config dict)."""
    ktc = vllm_config.kv_transfer_config
    return ktc, dict(getattr(ktc, "kv_connector_extra_config", None) or {})


def _tp(vllm_config):
    """(tp_rank, tp_size, dp_rank) of this process."""
    pc = vllm_config.parallel_config
    tp_size = int(getattr(pc, "tensor_parallel_size", 1) or 1)
    dp_rank = int(getattr(pc, "data_parallel_rank", 0) or 0)
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        tp_rank = get_tensor_model_parallel_rank()
    except Exception:  # no vLLM, or no TP group (the scheduler): the rank from the config
        tp_rank = int(getattr(pc, "rank", 0) or 0) % tp_size
    return tp_rank, tp_size, dp_rank


def _block_ids(blocks):
    """The first KV-cache group's block ids of a KVCacheBlocks, a tuple of lists, or a list."""
    if blocks is None:
        return []
    if hasattr(blocks, "get_block_ids"):
        blocks = blocks.get_block_ids()
    blocks = list(blocks)
    if blocks and isinstance(blocks[0], (list, tuple)):
        return [int(b) for b in blocks[0]]
    return [int(b) for b in blocks]


def _remote(p: dict, mode: str):
    """(engine id, host, port) of the P that kv_transfer_params name, or None when they name
    none or were made for the other mode (the request is then computed here)."""
    try:
        remote = str(p["remote_engine_id"]), str(p["remote_host"]), int(p["remote_port"])
    except (KeyError, TypeError, ValueError):
        log.warning("ferry.vllm: kv_transfer_params lack remote_engine_id/host/port: %s", p)
        return None
    if p.get("ferry_mode", mode) != mode:
        log.error("ferry.vllm: kv_transfer_params from a %s-mode prefill, this instance is in %s mode",
                  p.get("ferry_mode"), mode)
        return None
    return remote


def _status_name(request) -> str:
    s = getattr(request, "status", None)
    return getattr(s, "name", str(s))


class FerryConnector(KVConnectorBase_V1):
    """vLLM's KV connector over ferry.kv; see the module's docstring."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # vLLM versions whose base takes no kv_cache_config
            super().__init__(vllm_config, role)
        ktc, extra = _config(vllm_config)
        self._extra = extra
        self._mode = extra.get("mode", "write")
        if self._mode not in ("write", "read"):
            raise ValueError(f"kv_connector_extra_config mode must be 'write' or 'read', not {self._mode!r}")
        self._engine_id = str(getattr(ktc, "engine_id", None) or "ferry")
        self._host = str(extra.get("handshake_host") or getattr(ktc, "kv_ip", None) or "127.0.0.1")
        self._port = int(extra.get("handshake_port") or getattr(ktc, "kv_port", None) or 14579)
        self._tp_rank, self._tp_size, self._dp_rank = _tp(vllm_config)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._vllm = vllm_config
        self._role_name = getattr(role, "name", str(role)).upper()
        self._sched = _SchedulerSide(self) if self._role_name.endswith("SCHEDULER") else None
        if self._sched is None:
            from ._vllm_worker import WorkerSide  # late: it imports this module's types

            self._worker = WorkerSide(self)
        else:
            self._worker = None

    # ---- scheduler side ----
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._sched.matched(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._sched.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self._sched.build(scheduler_output)

    def request_finished(self, request, block_ids):
        return self._sched.finished(request, block_ids)

    def update_connector_output(self, connector_output):
        self._sched.output(connector_output)

    def has_pending_push_work(self):
        """True while blocks wait for a transfer's end: vLLM keeps stepping, so get_finished
        can hand them back, even when no request is running."""
        return bool(self._sched and self._sched.held)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return True  # save_kv_layer and wait_for_layer_load must run between the layers

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return FerryKVConnectorStats(data=dict(data) if data else {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        from ._vllm_metrics import FerryPromMetrics  # vllm:ferry_* (see that module)
        return FerryPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None  # ferry reads any layout from the tensors' shapes and strides

    # ---- worker side ----
    def register_kv_caches(self, kv_caches):
        self._worker.register(kv_caches)

    def start_load_kv(self, forward_context, **kwargs):
        self._worker.start_load(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name):
        self._worker.wait_layer(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        self._worker.save_layer(layer_name, kv_layer)

    def wait_for_save(self):
        self._worker.wait_save()

    def get_finished(self, finished_req_ids):
        return self._worker.finished()

    def get_block_ids_with_load_errors(self):
        return self._worker.load_errors()

    def get_kv_connector_stats(self):
        return self._worker.stats() if self._worker else None

    def handshake_address(self):
        """The worker's handshake endpoint ("host:port"), once its caches are registered."""
        return self._worker.address

    def shutdown(self):
        if self._worker:
            self._worker.close()


class _SchedulerSide:
    """Per-request bookkeeping in the scheduler: never blocks, never touches memory."""

    def __init__(self, c: FerryConnector):
        self.c = c
        self.computed = {}    # req_id -> local prefix tokens, from get_num_new_matched_tokens
        self.loads = []       # [Load] for the next metadata
        self.loading = {}     # req_id -> tid: D's async loads not yet reported finished
        self.producing = {}   # req_id -> [request, block ids]: P's requests until their save
        self.saved = {}       # req_id -> tid: P's requests whose save went to the workers
        self.saves, self.aborts, self.released = [], [], []
        self.held = set()     # req ids whose blocks request_finished kept (delay_free)

    def matched(self, request, num_computed_tokens):
        p = getattr(request, "kv_transfer_params", None) or {}
        if not p.get("do_remote_prefill") or _remote(p, self.c._mode) is None:
            return 0, False
        self.computed[request.request_id] = num_computed_tokens
        n = len(request.prompt_token_ids) - num_computed_tokens
        if self.c._mode == "write":
            return max(n, 0), n > 0
        # Read mode loads in the step that computes the last prompt token (a synchronous load).
        return max(n - 1, 0), False

    def after_alloc(self, request, blocks, num_external_tokens):
        p = getattr(request, "kv_transfer_params", None) or {}
        rid = request.request_id
        if p.get("do_remote_decode"):
            self.producing[rid] = [request, _block_ids(blocks)]
            return
        if not p.get("do_remote_prefill"):
            return
        p["do_remote_prefill"] = False  # one transfer a request, even when called again
        computed = self.computed.pop(rid, 0)
        tid = str(p.get("transfer_id") or p.get("remote_request_id") or rid)
        remote = _remote(p, self.c._mode)
        if remote is None:  # get_num_new_matched_tokens matched nothing for it
            return
        engine, host, port = remote
        bs = self.c._block_size
        total = len(request.prompt_token_ids)
        ids = _block_ids(blocks)[computed // bs:(total + bs - 1) // bs]
        if self.c._mode == "write" and num_external_tokens <= 0:
            ids = []  # a full prefix hit: P is only told to free its blocks
        load = Load(rid, tid, ids, computed, num_external_tokens, engine, int(p.get("remote_dp_rank", 0)),
                    int(p.get("remote_tp_size", 1)), host, port, [int(b) for b in p.get("remote_block_ids") or []],
                    int(p.get("remote_num_tokens") or total), notify_only=not ids)
        self.loads.append(load)  # an empty read, too, releases P's hold
        if self.c._mode == "write" and ids:
            self.loading[rid] = tid

    def build(self, scheduler_output):
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        for rid, new in zip(getattr(cached, "req_ids", None) or [], getattr(cached, "new_block_ids", None) or []):
            if rid in self.producing and new:
                self.producing[rid][1] += _block_ids(new)
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        for rid in scheduled:  # scheduled again: its load ended (for vLLMs without update_connector_output)
            self.loading.pop(rid, None)
        bs = self.c._block_size
        for rid, (request, ids) in list(self.producing.items()):
            n = scheduled.get(rid, 0)
            total = len(request.prompt_token_ids)
            if n and request.num_computed_tokens + n >= total:  # this step ends the prefill
                p = request.kv_transfer_params or {}
                tid = str(p.get("transfer_id") or rid)
                self.saves.append(Save(rid, tid, ids[:(total + bs - 1) // bs], total))
                self.saved[rid] = tid
                del self.producing[rid]
        meta = FerryConnectorMetadata(self.loads, self.saves, self.aborts, self.released)
        self.loads, self.saves, self.aborts, self.released = [], [], [], []
        return meta

    def finished(self, request, block_ids):
        rid = request.request_id
        p = getattr(request, "kv_transfer_params", None) or {}
        self.computed.pop(rid, None)
        if rid in self.loading:  # D gives up while loading: the blocks stay until no write can land
            self.aborts.append((rid, self.loading.pop(rid)))
            self.held.add(rid)
            return True, None
        if not p.get("do_remote_decode"):
            return False, None
        self.producing.pop(rid, None)
        tid = self.saved.pop(rid, None)
        if tid is None:  # never prefilled here: a D that allocated first learns of the abort
            self.aborts.append((rid, str(p.get("transfer_id") or rid)))
            return False, None
        self.released.append((rid, tid))
        self.held.add(rid)
        if _status_name(request) not in _NORMAL_ENDS:
            self.aborts.append((rid, tid))
            return True, None
        c = self.c
        return True, {
            "do_remote_prefill": True, "do_remote_decode": False, "transfer_id": tid,
            "remote_engine_id": c._engine_id, "remote_host": c._host,
            "remote_port": c._port + c._dp_rank * c._tp_size, "remote_dp_rank": c._dp_rank,
            "remote_tp_size": c._tp_size, "remote_block_ids": _block_ids(block_ids),
            "remote_num_tokens": len(request.prompt_token_ids), "ferry_mode": c._mode,
        }

    def output(self, connector_output):
        for rid in getattr(connector_output, "finished_recving", None) or ():
            self.loading.pop(rid, None)
        for rid in getattr(connector_output, "finished_sending", None) or ():
            self.held.discard(rid)
