"""The worker side of ferry.vllm.FerryConnector: a ferry.Engine and a ferry.kv.Connector over the
worker's KV caches, driven by the metadata that the scheduler side sends each step (see
ferry/vllm.py for the modes and how a request travels)."""

import logging
import sys
import threading
import time

from . import Engine, Error
from . import kv as _kv
from .vllm import _CONNECTOR_OPTIONS, _ROLES, FerryConnectorMetadata, FerryKVConnectorStats, Load

log = logging.getLogger("ferry.vllm")


class WorkerSide:
    """A worker's ferry.Engine and ferry.kv.Connector, driven by the metadata of each step."""

    def __init__(self, c):
        self.c = c
        self.conn = self.engine = self.address = None
        self.layers = {}       # layer name -> index
        self.meta = FerryConnectorMetadata()
        self.peers = set()     # (engine id, dp rank) whose every TP rank is known
        self.consuming = {}    # tid -> (Load, start time)
        self.reads = {}        # tid -> Load: this step's synchronous reads still loading (read mode)
        self.step_reads = set()  # tids of the reads started this step, whose errors it may report
        self.aborted = {}      # tid -> req_id: D loads that the scheduler gave up
        self.producing = {}    # tid -> Save
        self.saved = {}        # tid -> layers saved this step
        self.released = {}     # tid -> req_id: vLLM finished them, waiting for ferry's end
        self.ended = set()     # producer tids ferry ended before vLLM finished them
        self.stash = []        # ferry Finished popped early (read mode waits), for get_finished
        self.retry = {}        # tid -> until when: aborts of requests not known here yet
        self.retrier = None    # the thread that retries them
        self.lock = threading.Lock()  # guards retry, retrier and conn against that thread
        self.sending, self.recving, self.invalid = set(), set(), set()
        self.counts = FerryKVConnectorStats()
        self.last = {}

    def register(self, kv_caches):
        c = self.c
        extra = c._extra
        self.layers = {name: i for i, name in enumerate(kv_caches)}
        mc = getattr(c._vllm, "model_config", None)
        heads = None
        if mc is not None and not getattr(mc, "use_mla", False) and hasattr(mc, "get_total_num_kv_heads"):
            heads = mc.get_total_num_kv_heads()
        engine_options = dict(extra.get("engine") or {})
        engine_options.setdefault("key", f"{c._engine_id}/dp{c._dp_rank}/tp{c._tp_rank}")
        self.engine = Engine(**engine_options)
        options = {k: extra[k] for k in _CONNECTOR_OPTIONS if k in extra}
        ktc = c._vllm.kv_transfer_config
        self.conn = _kv.register_kv_caches(
            self.engine, kv_caches, model=str(getattr(mc, "model", None) or extra.get("model", "model")),
            instance=c._engine_id, tp_rank=c._tp_rank, tp_size=c._tp_size, dp_rank=c._dp_rank,
            block_tokens=c._block_size, layout=extra.get("layout"), mode=c._mode,
            role=_ROLES.get(getattr(ktc, "kv_role", None), "both"), total_kv_heads=heads, **options)
        port = c._port + c._dp_rank * c._tp_size + c._tp_rank
        self.address = self.conn.serve_handshake(str(extra.get("handshake_bind_host", c._host)), port)
        log.info("ferry.vllm: %s serves its handshake on %s (%s mode)", self.conn.id, self.address, c._mode)

    # ---- the step ----
    def start_load(self, meta):
        self.meta = meta if meta is not None else FerryConnectorMetadata()
        for rid, tid in self.meta.released:
            if tid in self.ended:
                self.ended.discard(tid)
                self.sending.add(rid)
            else:
                self.released[tid] = rid
        now = time.monotonic()
        for rid, tid in self.meta.aborts:
            if tid in self.consuming:
                self.aborted[tid] = rid
            try:
                self.conn.abort(tid)
            except Error as e:  # NOT_FOUND: it ended already, or is not known here yet
                if tid in self.aborted:  # ended as D already: its blocks are free to go
                    del self.aborted[tid]
                    self.sending.add(rid)
                else:
                    self._retry_abort(tid, now + float(self.c._extra.get("transfer_timeout_ms", 30000)) / 1000)
                log.debug("ferry.vllm: abort %s: %s", tid, e)
        self.reads, self.step_reads = {}, set()
        for load in self.meta.loads:
            self._start(load)
        self.producing.update({s.tid: s for s in self.meta.saves})
        self.saved = {s.tid: 0 for s in self.meta.saves}

    def _retry_abort(self, tid: str, until: float):
        """P aborts a request whose D allocation may still be on its way (a router that sent to
        both): a thread tries again until it lands or `until`, so D learns of the abort now and
        not at its transfer timeout, even when no step follows (an idle vLLM does not step)."""
        with self.lock:
            if len(self.retry) >= 65536:
                return
            self.retry[tid] = until
            if self.retrier is not None:
                return
            self.retrier = threading.Thread(target=self._retry_loop, name="ferry-vllm-abort", daemon=True)
            self.retrier.start()

    def _retry_loop(self):
        while True:
            time.sleep(0.01)
            with self.lock:
                if not self.retry or self.conn is None:
                    self.retrier = None
                    return
                for tid, until in list(self.retry.items()):
                    try:
                        self.conn.abort(tid)
                        del self.retry[tid]
                    except Error:
                        if time.monotonic() > until:
                            del self.retry[tid]

    def _start(self, load: Load):
        try:
            key = (load.engine, load.dp_rank)
            if key not in self.peers:
                for r in range(load.tp_size):
                    self.conn.add_peer_from(f"{load.host}:{load.port + r}")
                self.peers.add(key)
            if self.c._mode == "write":
                self.conn.expect_write(load.tid, load.engine, load.dp_rank, load.blocks, load.num_tokens,
                                       load.first_token)
            else:
                params = _kv.ReadParams(
                    request=load.tid, producer=_kv.WorkerId(load.engine, load.dp_rank, 0),
                    producer_tp_size=load.tp_size, handshake=f"{load.host}:{load.port}",
                    blocks=load.remote_blocks, num_tokens=load.remote_tokens)
                self.step_reads.add(load.tid)
                self.conn.start_read(params, load.blocks, load.first_token)
                if load.blocks:
                    self.reads[load.tid] = load
        except (Error, ValueError, TypeError) as e:  # a peer gone, or params that do not parse
            log.warning("ferry.vllm: request %s from %s: %r; its blocks are reported for recompute", load.req_id,
                        load.engine, e)
            self.counts.data["num_failed_transfers"] += 1
            self.invalid.update(load.blocks)
            if self.c._mode == "write" and not load.notify_only:
                self.recving.add(load.req_id)  # async: it must still appear in get_finished
            return
        self.consuming[load.tid] = (load, time.monotonic())

    def wait_layer(self, layer_name):
        i = self.layers.get(layer_name)
        if i is None or not self.reads:
            return
        timeout = float(self.c._extra.get("transfer_timeout_ms", 30000))
        for tid, load in list(self.reads.items()):
            try:
                self.conn.wait_layer(tid, i, timeout)
            except Error as e:
                log.warning("ferry.vllm: request %s: layer %s did not load: %s", load.req_id, layer_name, e)
                self.invalid.update(load.blocks)
                del self.reads[tid]

    def save_layer(self, layer_name, kv_layer):
        i = self.layers.get(layer_name)
        if i is None or self.c._mode != "write" or not self.meta.saves:
            return
        ready = None
        if getattr(getattr(kv_layer, "device", None), "type", "cpu") == "cuda":
            import torch

            ready = torch.cuda.Event()
            ready.record()  # after this layer's kernels on the current stream
        for s in self.meta.saves:
            try:
                self.conn.save_layer(s.tid, i, s.blocks, ready=ready)
                self.saved[s.tid] += 1
            except Error as e:  # it ended (aborted by D): its end comes through pop_finished
                log.debug("ferry.vllm: save %s layer %s: %s", s.tid, layer_name, e)

    def wait_save(self):
        if self.c._mode == "write":
            for s in self.meta.saves:
                try:
                    self.conn.seal(s.tid, self.saved.get(s.tid, 0))
                except Error as e:
                    log.debug("ferry.vllm: seal %s: %s", s.tid, e)
                    if not self.saved.get(s.tid):  # no write was posted: nothing reads the blocks
                        self.ended.add(s.tid)
            return
        if self.meta.saves:
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.current_stream().synchronize()  # the held blocks hold the whole prefill
        for s in self.meta.saves:
            try:
                self.conn.hold_for_read(s.tid, s.blocks, s.num_tokens)
            except Error as e:  # not held: the blocks go back when vLLM finishes the request
                log.warning("ferry.vllm: hold %s: %s", s.tid, e)
                self.ended.add(s.tid)
        # This step's reads end with P's answer to the release: a read of blocks P no longer
        # held is reported now, in the step that used it (vLLM's contract for sync loads).
        deadline = time.monotonic() + float(self.c._extra.get("transfer_timeout_ms", 30000)) / 1000
        waiting = set(self.reads)
        while waiting and time.monotonic() < deadline:
            got = self.conn.wait_finished(max(1.0, (deadline - time.monotonic()) * 1000))
            self.stash += got
            waiting -= {f.request for f in got if not f.producer}
        self.reads = {}

    def finished(self):
        fins = self.stash + (self.conn.pop_finished() if self.conn else [])
        self.stash = []
        for f in fins:
            (self._produced if f.producer else self._consumed)(f)
        sending, recving = self.sending, self.recving
        self.sending, self.recving = set(), set()
        return sending or None, recving or None

    def _consumed(self, f):
        load, start = self.consuming.pop(f.request, (None, None))
        if load is None:
            return
        rid = self.aborted.pop(f.request, None)
        if f.outcome == "done":
            self.counts.data["num_successful_transfers"] += 1
            self.counts.data["transfer_ms"].append((time.monotonic() - start) * 1000)
        elif rid is None:
            log.warning("ferry.vllm: request %s: %s %s %s", load.req_id, f.outcome, f.code, f.message)
            self.counts.data["num_failed_transfers"] += 1
            # A sync load's errors belong to the step that used it: later, the blocks may hold
            # another request (the failure is logged, too late to recompute).
            if self.c._mode == "write" or f.request in self.step_reads:
                self.invalid.update(f.blocks or load.blocks)
        if rid is not None:
            self.sending.add(rid)  # vLLM finished it while loading: its blocks may go now
        elif self.c._mode == "write" and not load.notify_only:
            self.recving.add(load.req_id)

    def _produced(self, f):
        if f.outcome == "done":
            self.counts.data["num_successful_transfers"] += 1
        else:
            log.info("ferry.vllm: sending %s: %s %s %s", f.request, f.outcome, f.code, f.message)
            self.counts.data["num_failed_transfers"] += 1
        self.producing.pop(f.request, None)
        rid = self.released.pop(f.request, None)
        if rid is not None:
            self.sending.add(rid)
        else:
            self.ended.add(f.request)

    def load_errors(self):
        out, self.invalid = self.invalid, set()
        return out

    def stats(self):
        if self.conn is None:
            return None
        now = self.conn.stats()
        self.counts.data["bytes_transferred"] += now["bytes"] - self.last.get("bytes", 0)
        self.counts.data["num_kv_expired_blocks"] += now["blocks_expired"] - self.last.get("blocks_expired", 0)
        self.last = now
        if self.counts.is_empty() and not self.counts.data["bytes_transferred"]:
            return None
        out, self.counts = self.counts, FerryKVConnectorStats()
        return out

    def close(self):
        with self.lock:
            conn, engine, self.conn, self.engine = self.conn, self.engine, None, None
        if conn is not None:
            conn.close()
            engine.close()
