"""Stand-ins for vLLM's objects and its call order, to drive ferry.vllm.FerryConnector where vLLM
cannot be installed.

Run as a script, it is one vLLM instance (prefill or decode: a scheduler and one worker, in one
process, their metadata pickled between them as vLLM does), commanded with one JSON object a
line on stdin and answering one a line on stdout (after the marker @@):

    python3 vllm_standin.py '{"name": "prefill", "mode": "write", "port": 15000, "order": "blocks_first"}'

Commands: add (requests with kv_transfer_params), abort, step, run (steps until requests are
resolved), stats, quit. Every request's KV is a function of its id and layer (expected()), so
the decode instance checks every byte it received without seeing the prefill's memory.
"""

import enum
import json
import logging
import os
import pickle
import sys
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from ferry.vllm import FerryConnector, KVConnectorRole

LAYERS, N, BS, H, D = 4, 64, 16, 2, 8


# ---- vLLM's objects, as far as a connector sees them ----------------------------------------


@dataclass
class KVTransferConfig:
    kv_connector: str = "FerryConnector"
    kv_connector_module_path: str = "ferry.vllm"
    kv_role: str = "kv_both"
    engine_id: str = ""
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: dict = field(default_factory=dict)


@dataclass
class CacheConfig:
    block_size: int = BS


@dataclass
class ModelConfig:
    model: str = "standin/tiny-llama"
    use_mla: bool = False

    def get_total_num_kv_heads(self):
        return H


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    data_parallel_rank: int = 0
    rank: int = 0


@dataclass
class VllmConfig:
    kv_transfer_config: KVTransferConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)


class RequestStatus(enum.Enum):
    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1
    RUNNING = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list
    kv_transfer_params: dict
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0


class KVCacheBlocks:
    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (list(self.ids),)


@dataclass
class CachedRequestData:
    req_ids: list = field(default_factory=list)
    new_block_ids: list = field(default_factory=list)


@dataclass
class SchedulerOutput:
    num_scheduled_tokens: dict
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    kv_connector_metadata: object = None


@dataclass
class KVConnectorOutput:
    finished_sending: object = None
    finished_recving: object = None
    invalid_block_ids: set = field(default_factory=set)


def expected(rid: str, layer: int, tokens: int) -> np.ndarray:
    """The KV of request rid's layer: [2 (K, V), tokens, H, D]."""
    rng = np.random.default_rng([zlib.crc32(rid.encode()), layer])
    return rng.integers(0, 1 << 16, (2, tokens, H, D), dtype=np.uint16)


def make_caches(order: str, use_torch: bool, h: int = H):
    """(what vLLM registers: {layer name: tensor}, numpy uint16 views of the same memory), for a
    rank that holds h heads."""
    shape = {"kv_first": (2, N, BS, h, D), "blocks_first": (N, 2, BS, h, D), "kv_first_hnd": (2, N, h, BS, D)}[order]
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    if not use_torch:
        arrays = {n: np.zeros(shape, np.uint16) for n in names}
        return arrays, arrays
    import torch

    tensors = {n: torch.zeros(shape, dtype=torch.int16) for n in names}  # torch 1.13 has no uint16
    return tensors, {n: t.numpy().view(np.uint16) for n, t in tensors.items()}


def k_v(cache: np.ndarray, order: str):
    """(K, V) of one layer as [N, bs, H, D] views."""
    k, v = (cache[:, 0], cache[:, 1]) if order == "blocks_first" else (cache[0], cache[1])
    if order.endswith("_hnd"):
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    return k, v


# ---- one instance and its step loop ---------------------------------------------------------


class Rank:
    """One TP worker: its connector and its slice of the heads' caches."""

    def __init__(self, ktc: KVTransferConfig, tp_rank: int, tp: int, order: str, use_torch: bool):
        self.first, self.h = tp_rank * H // tp, H // tp
        config = VllmConfig(ktc, parallel_config=ParallelConfig(tensor_parallel_size=tp, rank=tp_rank))
        self.connector = FerryConnector(config, KVConnectorRole.WORKER)
        self.tensors, self.caches = make_caches(order, use_torch, self.h)
        self.connector.register_kv_caches(self.tensors)


class Instance:
    """A vLLM instance reduced to what its connector sees: a block pool, requests and steps;
    `tp` workers (TP ranks) in this one process, each with its own ferry engine."""

    def __init__(self, cfg: dict):
        self.name, self.order = cfg["name"], cfg.get("order", "kv_first")
        extra = {"mode": cfg.get("mode", "write"), "handshake_port": cfg["port"],
                 "engine": {"transports": cfg.get("transports", ["ucx"])}}
        extra.update(cfg.get("extra", {}))
        ktc = KVTransferConfig(engine_id=cfg["name"], kv_connector_extra_config=extra)
        tp = cfg.get("tp", 1)
        self.sched = FerryConnector(VllmConfig(ktc, parallel_config=ParallelConfig(tensor_parallel_size=tp)),
                                    KVConnectorRole.SCHEDULER)
        self.ranks = [Rank(ktc, r, tp, self.order, cfg.get("torch", False)) for r in range(tp)]
        self.worker = self.ranks[0].connector
        self.counts = {"sending": {}, "recving": {}}  # as vLLM's KVOutputAggregator: every rank must report
        self.free = list(np.random.default_rng(zlib.crc32(self.name.encode())).permutation(N).tolist())
        self.reqs, self.blocks = {}, {}   # request id -> Request, its blocks
        self.runnable = {}                # request id -> tokens to compute in the next step
        self.held = set()                 # finished requests whose blocks the connector holds
        self.results, self.params = {}, {}

    def add(self, rid: str, length: int, params: dict) -> dict:
        req = Request(rid, list(range(length)), dict(params or {}))
        n, load_async = self.sched.get_num_new_matched_tokens(req, 0)
        assert n is not None
        ids = [self.free.pop() for _ in range((length + BS - 1) // BS)]
        self.reqs[rid], self.blocks[rid] = req, ids
        self.sched.update_state_after_alloc(req, KVCacheBlocks(ids), n)
        if load_async:
            req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        else:
            req.num_computed_tokens = n  # a synchronous load counts as computed in this step
            self.runnable[rid] = length - n
        return {"matched": n, "async": load_async, "blocks": ids}

    def abort(self, rid: str) -> dict:
        req = self.reqs[rid]
        self.runnable.pop(rid, None)
        req.status = RequestStatus.FINISHED_ABORTED
        self.results[rid] = "aborted"
        return self._finish(req)

    def _finish(self, req: Request) -> dict:
        delay, params = self.sched.request_finished(req, KVCacheBlocks(self.blocks[req.request_id]).get_block_ids())
        if params is not None:
            self.params[req.request_id] = json.loads(json.dumps(params))  # through HTTP as JSON
        if delay:
            self.held.add(req.request_id)
        else:
            self._free(req.request_id)
        return {"delay_free": delay, "params": params}

    def _free(self, rid: str):
        self.free += self.blocks.pop(rid)
        self.reqs.pop(rid, None)

    @staticmethod
    def _key(req: Request) -> str:
        """What the KV is a function of: the transfer both sides name (P's request id by default)."""
        return (req.kv_transfer_params or {}).get("transfer_id") or req.request_id

    def _compute(self, layer: int, rid: str, tokens: int):
        """The model's attention for `layer`: the KV of the tokens computed this step."""
        req = self.reqs[rid]
        length, first = len(req.prompt_token_ids), req.num_computed_tokens
        want, ids = expected(self._key(req), layer, length), self.blocks[rid]
        for rank in self.ranks:
            cache = list(rank.caches.values())[layer]
            for x, w in zip(k_v(cache, self.order), want[:, :, rank.first:rank.first + rank.h]):
                for t in range(first, first + tokens):
                    x[ids[t // BS], t % BS] = w[t]

    def _verify(self, rid: str) -> str:
        req, ids = self.reqs[rid], self.blocks[rid]
        length = len(req.prompt_token_ids)
        for rank in self.ranks:
            for layer, cache in enumerate(rank.caches.values()):
                want = expected(self._key(req), layer, length)[:, :, rank.first:rank.first + rank.h]
                for x, w in zip(k_v(cache, self.order), want):
                    got = x[ids].reshape(-1, rank.h, D)[:length]
                    if not np.array_equal(got, w):
                        return f"corrupt: layer {layer}, {int((got != w).any(axis=(1, 2)).sum())} tokens differ"
        return "done"

    def step(self) -> dict:
        """One engine step in vLLM's order: schedule, connector metadata, the worker's hooks
        around the forward, its outputs, then the scheduler's update."""
        scheduled, self.runnable = self.runnable, {}
        meta = pickle.dumps(self.sched.build_connector_meta(SchedulerOutput(dict(scheduled))))
        workers = [r.connector for r in self.ranks]
        for w in workers:
            w.bind_connector_metadata(pickle.loads(meta))  # to each worker process
            w.start_load_kv(None)
        if scheduled:
            for layer, name in enumerate(self.ranks[0].caches):
                for w in workers:
                    w.wait_for_layer_load(name)
                for rid, tokens in scheduled.items():
                    self._compute(layer, rid, tokens)
                for rank in self.ranks:
                    rank.connector.save_kv_layer(name, rank.tensors[name], None)
            for w in workers:
                w.wait_for_save()
        sending, recving, invalid = set(), set(), set()
        for w in workers:
            for what, ids, done in zip(("sending", "recving"), w.get_finished(set()), (sending, recving)):
                for rid in ids or ():
                    self.counts[what][rid] = self.counts[what].get(rid, 0) + 1
                    if self.counts[what][rid] == len(workers):
                        del self.counts[what][rid]
                        done.add(rid)
            invalid |= w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()
        out = KVConnectorOutput(sending, recving, invalid)
        self.sched.update_connector_output(out)
        for rid in scheduled:  # prefill: one token (LENGTH_CAPPED); decode: checked, then stopped
            req = self.reqs[rid]
            bad = invalid & set(self.blocks[rid])
            if (req.kv_transfer_params or {}).get("do_remote_decode"):
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self.results[rid] = "prefilled"
            else:
                req.status = RequestStatus.FINISHED_STOPPED
                self.results[rid] = "recompute" if bad else self._verify(rid)
            self._finish(req)
        for rid in recving or ():
            bad = invalid & set(self.blocks[rid])
            self.results[rid] = "recompute" if bad else self._verify(rid)
            req = self.reqs[rid]
            req.status = RequestStatus.FINISHED_STOPPED
            self._finish(req)
        for rid in sending or ():
            assert rid in self.held, f"{rid} sent but not held"
            self.held.discard(rid)
            self._free(rid)
        return {"sending": sorted(sending or ()), "recving": sorted(recving or ()), "invalid": sorted(invalid)}

    def run(self, ids, until: str, timeout_s: float) -> dict:
        """Steps until every request of `ids` has a result ("result") or its blocks are free
        again ("freed")."""
        deadline, steps = time.monotonic() + timeout_s, []

        def pending():
            if until == "result":
                return [r for r in ids if r not in self.results]
            return [r for r in ids if r in self.blocks]

        while pending() and time.monotonic() < deadline:
            s = self.step()
            if any(s.values()):
                steps.append(s)
            time.sleep(0.005)
        return {"pending": pending(), "steps": steps}

    def state(self) -> dict:
        return {"results": self.results, "params": self.params, "free": len(self.free), "held": sorted(self.held),
                "push_work": self.sched.has_pending_push_work()}


def main():
    logging.basicConfig(level=os.environ.get("FERRY_VLLM_LOG", "INFO"), stream=sys.stderr,
                        format="%(name)s %(levelname)s: %(message)s")
    inst = Instance(json.loads(sys.argv[1]))
    print("@@" + json.dumps({"ready": True, "address": inst.worker.handshake_address()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("cmd")
        if op == "quit":
            break
        if op == "add":
            out = {r["id"]: inst.add(r["id"], r["len"], r.get("params")) for r in cmd["requests"]}
        elif op == "abort":
            out = inst.abort(cmd["id"])
        elif op == "step":
            out = inst.step()
        elif op == "run":
            out = inst.run(cmd["ids"], cmd["until"], cmd.get("timeout_s", 10))
        elif op == "stats":
            s = None
            for rank in inst.ranks:
                one = rank.connector.get_kv_connector_stats()
                s = one if s is None else (s.aggregate(one) if one is not None else s)
            out = s.reduce() if s is not None else {}
        else:
            out = {"error": f"unknown command {op}"}
        out = dict(out) if isinstance(out, dict) else {"value": out}
        out["state"] = inst.state()
        print("@@" + json.dumps(out), flush=True)  # a marker: libraries may print too
    for rank in inst.ranks:
        rank.connector.shutdown()


if __name__ == "__main__":
    main()
