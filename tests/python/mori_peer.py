"""One side (prefill or decode) of vLLM's MoRIIO connector, as a child process: the seed's
MoRIIOWrapper/MoRIIOWriter (mori_seed.py) on ferry.mori, with a small stand-in for the parts of
the connector worker and scheduler they call. test_mori_seed.py drives two of them.

Usage: mori_peer.py ROLE(prefill|decode) MODE(write|read) ARRAYS(torch|numpy)
Commands come as JSON lines on stdin, each answered by one JSON line on stdout.
"""

import base64
import json
import socket
import sys
import time
import traceback

import msgpack
import numpy as np
import zmq

import ferry.mori as io
import mori_seed

LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(3)]
BLOCK_SIZE, HEADS, HEAD_DIM = 4, 2, 8
NUM_BLOCKS = {"prefill": 12, "decode": 16}  # different: the V plane's remote offset matters
HOST = "127.0.0.1"


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def unb64(s: str) -> bytes:
    return base64.b64decode(s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def expected_bytes(layer: int) -> np.ndarray:
    """The prefill's cache of `layer`, as bytes shaped [2, num_blocks, block bytes]."""
    nb = NUM_BLOCKS["prefill"]
    block = BLOCK_SIZE * HEADS * HEAD_DIM * 2
    rng = np.random.default_rng(1000 + layer)
    return rng.integers(0, 256, 2 * nb * block, dtype=np.uint8).reshape(2, nb, block)


class Cache:
    """One layer's KV cache [2, num_blocks, block_size, heads, head_dim] of float16, a torch
    tensor or a numpy array, with a byte view for checks."""

    def __init__(self, arrays: str, num_blocks: int):
        shape = (2, num_blocks, BLOCK_SIZE, HEADS, HEAD_DIM)
        if arrays == "torch":
            import torch
            self.tensor = torch.zeros(shape, dtype=torch.float16)
            self.bytes = self.tensor.numpy().view(np.uint8).reshape(2, num_blocks, -1)
            self.strides = list(self.tensor.stride())
            self.element_size = self.tensor.element_size()
        else:
            self.tensor = np.zeros(shape, np.float16)
            self.bytes = self.tensor.view(np.uint8).reshape(2, num_blocks, -1)
            self.element_size = self.tensor.itemsize
            self.strides = [s // self.element_size for s in self.tensor.strides]


class Event:
    """torch.cuda.Event's stand-in: the layer's KV is already in place."""

    def synchronize(self):
        pass


class Worker:
    """The parts of MoRIIOConnectorWorker that MoRIIOWriter calls (vLLM's, seed era)."""

    def __init__(self, seed, role: str, arrays: str):
        self.tp_rank, self.dp_rank = 0, 0
        self.num_blocks = NUM_BLOCKS[role]
        self.notify_port = free_port()
        self.engine = io.IOEngine(f"{role}:{HOST}:tp 0:dp 0", io.IOEngineConfig(HOST, 0))
        self.moriio_wrapper = seed.MoRIIOWrapper(tp_rank=0, dp_rank=0)
        self.moriio_wrapper.set_moriio_engine(self.engine)
        self.moriio_wrapper.set_backend_type(io.BackendType.RDMA)
        self.moriio_wrapper.notify_port = self.notify_port
        self.kv_caches, self.layer_name_to_local_kv_cache_metadata = {}, {}
        for i, name in enumerate(LAYERS):
            cache = Cache(arrays, self.num_blocks)
            if role == "prefill":
                cache.bytes[...] = expected_bytes(i)
            self.kv_caches[name] = cache
            packed = self.moriio_wrapper.register_local_tensor(cache.tensor)
            self.layer_name_to_local_kv_cache_metadata[name] = [packed]
        self.num_layers = len(self.kv_caches)
        self.remote = {}  # engine id -> (layer metadata, MoRIIOAgentMetadata)
        self.sessions = {}
        self.moriio_wrapper.async_wait_reqid()

    def metadata(self) -> dict:
        return {
            "engine": b64(self.moriio_wrapper.get_agent_metadata()),
            "layers": {k: b64(v[0]) for k, v in self.layer_name_to_local_kv_cache_metadata.items()},
            "notify_port": self.notify_port, "num_blocks": self.num_blocks,
        }

    def handshake(self, peer: dict, engine_id: str = "peer_dp0") -> None:
        key = self.moriio_wrapper.register_remote_engine(unb64(peer["engine"]))
        meta = mori_seed.MoRIIOAgentMetadata(
            engine_id=key, agent_metadata=unb64(peer["engine"]), kv_caches_base_addr=None,
            num_blocks=peer["num_blocks"], block_len=0, attn_backend_name="FLASH_ATTN")
        self.remote[engine_id] = ({k: unb64(v) for k, v in peer["layers"].items()}, meta)

    def get_engine_name_with_dp(self, engine_id, dp_rank):
        return f"{engine_id}_dp{dp_rank}"

    def _get_built_session(self, engine_id):
        layers, meta = self.remote[engine_id]
        if engine_id not in self.sessions:
            w = self.moriio_wrapper
            self.sessions[engine_id] = [
                w.build_session(w.get_unpack_memory_metadata(local[0]),
                                w.get_unpack_memory_metadata(layers[name]))
                for name, local in self.layer_name_to_local_kv_cache_metadata.items()]
            assert all(s is not None for s in self.sessions[engine_id])
        return self.sessions[engine_id], meta

    def _compute_block_transfer_offsets(self, layer_name, local_ids, remote_ids, remote_meta):
        """vLLM's: a K and a V piece per block pair, runs adjacent on both sides merged."""
        cache = self.kv_caches[layer_name]
        stride, sz = cache.strides, cache.element_size
        bstride = stride[1]
        piece = BLOCK_SIZE * HEADS * HEAD_DIM * sz
        ops = []
        for lb, rb in zip(local_ids, remote_ids):
            ops.append((sz * lb * bstride, sz * rb * bstride, piece))
            ops.append((sz * (stride[0] + lb * bstride),
                        sz * (bstride * remote_meta.num_blocks + rb * bstride), piece))
        ops.sort()
        merged = [list(ops[0])]
        for lo, ro, n in ops[1:]:
            last = merged[-1]
            if last[0] + last[2] == lo and last[1] + last[2] == ro:
                last[2] += n
            else:
                merged.append([lo, ro, n])
        return [m[0] for m in merged], [m[1] for m in merged], [m[2] for m in merged]

    def check_blocks(self, pairs, only_pairs=False) -> list:
        """Mismatches of every byte of this (decode) side's cache: each (prefill block,
        decode block) pair holds the prefill's bytes, every other block is still zero
        (unless only_pairs)."""
        bad, touched = [], set()
        for i, name in enumerate(LAYERS):
            want, got = expected_bytes(i), self.kv_caches[name].bytes
            for p_block, d_block in pairs:
                touched.add(d_block)
                for kv in range(2):
                    if not np.array_equal(got[kv, d_block], want[kv, p_block]):
                        bad.append(f"{name} kv {kv} block {p_block}->{d_block}")
            for d_block in set() if only_pairs else set(range(self.num_blocks)) - touched:
                if got[:, d_block].any():
                    bad.append(f"{name} block {d_block} written but not allocated")
        return bad


def wait_until(predicate, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


class Peer:
    def __init__(self, role, mode, arrays):
        self.seed = mori_seed.load(use_torch=arrays == "torch")
        self.seed.set_role(mori_seed.ROLE.PRODUCER if role == "prefill" else mori_seed.ROLE.CONSUMER)
        self.role, self.mode = role, mode
        self.worker = Worker(self.seed, role, arrays)
        self.writer = self.seed.MoRIIOWriter(self.worker)
        self.peer = None
        self.finished = set()

    def cmd_peer(self, c):
        self.peer = c["peer"]
        initiator = "prefill" if self.mode == "write" else "decode"
        if self.role == initiator:
            self.worker.handshake(self.peer)
        return {}

    def cmd_schedule(self, c):  # prefill, write mode: one WriteTask per layer per request
        for req, p_blocks in c["requests"].items():
            for name in LAYERS:
                self.writer.schedule_write(mori_seed.WriteTask(
                    request_id=req, dst_engine_id="peer", local_block_ids=p_blocks,
                    remote_block_ids_hint=None, layer_name=name, event=Event(),
                    remote_notify_port=self.peer["notify_port"], remote_ip=HOST))
        if c.get("expect_deferred"):
            n = len(c["requests"]) * len(LAYERS)
            wait_until(lambda: self.writer._write_task_q.empty() and
                       len(self.writer._deferred_tasks) == n, 10.0)
        return {"deferred": len(self.writer._deferred_tasks)}

    def cmd_await_alloc(self, c):  # prefill: the allocation messages arrived
        table = self.worker.moriio_wrapper.done_remote_allocate_req_dict
        return {"ok": wait_until(lambda: all(r in table for r in c["requests"]))}

    def cmd_allocate(self, c):  # decode scheduler, write mode: tell the prefill the blocks
        ctx = zmq.Context.instance()
        sock = mori_seed.make_zmq_socket(ctx, mori_seed.make_zmq_path(
            "tcp", HOST, self.peer["notify_port"]), zmq.DEALER, bind=False)
        for req, d_blocks in c["requests"].items():
            sock.send(msgpack.dumps({"req_id": req, "block_notify_list": d_blocks,
                                     "decode_rank": 0, "type": "remote_blocks"}))
        sock.close(linger=5000)
        return {}

    def _await_ids(self, pop, requests, timeout_s):
        def done():
            self.finished |= pop()
            return set(requests) <= self.finished
        return wait_until(done, timeout_s)

    def cmd_await_written(self, c):  # decode, write mode: completion notices, then bytes
        pairs = [p for req in c["requests"].values() for p in zip(*req)]
        ok = self._await_ids(self.worker.moriio_wrapper.pop_finished_write_req_ids,
                             c["requests"], c.get("timeout_s", 30))
        return {"ok": ok, "done": sorted(self.finished), "bad": self.worker.check_blocks(pairs)}

    def cmd_await_sent(self, c):  # prefill: the requests it may free
        ok = self._await_ids(self.worker.moriio_wrapper.pop_finished_req_ids, c["requests"],
                             c.get("timeout_s", 30))
        return {"ok": ok, "done": sorted(self.finished)}

    def cmd_read(self, c):  # decode, read mode: every request's layers in flight at once
        w = self.worker
        sessions, meta = w._get_built_session("peer_dp0")
        posted = {}
        for req, (p_blocks, d_blocks) in c["requests"].items():
            lo, ro, sizes = w._compute_block_transfer_offsets(LAYERS[0], d_blocks, p_blocks, meta)
            posted[req] = [w.moriio_wrapper.read_remote_data(sizes, lo, ro, sessions[i])
                           for i in range(len(LAYERS))]
        bad = []
        for req, statuses in posted.items():  # as vLLM: done when the last status succeeded
            if not wait_until(lambda: statuses[-1].Succeeded() or statuses[-1].Failed()):
                bad.append(f"{req}: still in progress")
            elif statuses[-1].Failed():
                bad.append(f"{req}: {statuses[-1].Message()}")
            # At once: the last status's success must mean every layer's bytes are here.
            p_blocks, d_blocks = c["requests"][req]
            bad += w.check_blocks(list(zip(p_blocks, d_blocks)), only_pairs=True)
            w.moriio_wrapper.send_notify(req, HOST, self.peer["notify_port"])
        pairs = [p for req in c["requests"].values() for p in zip(*req)]
        return {"bad": bad + w.check_blocks(pairs)}


def main():
    role, mode, arrays = sys.argv[1:4]
    peer = Peer(role, mode, arrays)
    print(json.dumps({"ready": peer.worker.metadata()}), flush=True)
    for line in sys.stdin:
        c = json.loads(line)
        if c["cmd"] == "exit":
            peer.worker.moriio_wrapper.shutdown()
            print(json.dumps({}), flush=True)
            return
        try:
            reply = getattr(peer, "cmd_" + c["cmd"])(c)
        except Exception:
            reply = {"error": traceback.format_exc()}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
