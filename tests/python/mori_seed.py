"""Loads vLLM's MoRIIOWrapper and MoRIIOWriter from the seed text, unchanged, with ferry.mori
in place of mori.io and small stand-ins for the vLLM names they use (their seed-era
definitions, from /work/shared/reference/mori-api.md section 2).

The seed file is not a Python module (it opens with a page title), so the classes' source is
found with ast from the first top-level `class` line on, and only those two classes run.
"""

import ast
import contextlib
import enum
import logging
import os
import threading
import time
import types
from dataclasses import dataclass, field
from queue import Empty, Queue
from typing import Any
from weakref import ref as weakref_ref

import msgpack
import zmq

import ferry.mori

SEED = os.environ.get("FERRY_MORI_SEED", "/work/shared/seeds/moriio_engine.py.txt")
CLASSES = ("MoRIIOWrapper", "MoRIIOWriter")


class ROLE(enum.Enum):
    PRODUCER = "producer"
    CONSUMER = "consumer"
    NOTINIT = "notinit"


_role = [ROLE.NOTINIT]


def get_role():
    return _role[0]


def set_role(role):
    _role[0] = role


class MoRIIOConstants:
    GET_META_MSG = b"get_meta_msg"
    POP_DONE_RECV = b"pop_done_recv"
    OVER = b"OVER"
    COMPLETION_PREFIX = "cmpl"
    PING_INTERVAL = 5
    MAX_PING_RETRIES = 100


class MoRIIOError(Exception):
    pass


class HandshakeError(MoRIIOError):
    pass


class TransferError(MoRIIOError):
    pass


@dataclass
class WriteTask:
    request_id: str
    dst_engine_id: str
    local_block_ids: list
    remote_block_ids_hint: Any
    layer_name: str
    event: Any
    remote_notify_port: int
    remote_ip: str
    enqueue_time: float = field(default_factory=time.perf_counter)
    retried: int = 0


@dataclass
class LayerTransferPlan:
    request_id: str
    layer_name: str
    sess_idx: int
    transfer_local_offsets: Any
    transfer_remote_offsets: Any
    transfer_sizes: Any
    use_batch: bool = True


@dataclass
class RemoteAllocInfo:
    block_ids: list
    writes_done: int = 0
    decode_dp_rank: int = 0
    transfer_offset: Any = None


@dataclass
class MoRIIOAgentMetadata:
    engine_id: str
    agent_metadata: bytes
    kv_caches_base_addr: Any
    num_blocks: int
    block_len: int
    attn_backend_name: str


def get_port_offset(dp_rank, tp_rank, tp_size=1):
    return dp_rank * tp_size + tp_rank


def make_zmq_path(scheme, host, port=None):
    if port is None:
        return f"{scheme}://{host}"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def make_zmq_socket(ctx, path, socket_type, bind=None, identity=None, linger=None):
    sock = ctx.socket(socket_type)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    if linger is not None:
        sock.setsockopt(zmq.LINGER, linger)
    if bind is None:
        bind = socket_type not in (zmq.PUSH, zmq.SUB, zmq.XSUB)
    (sock.bind if bind else sock.connect)(path)
    return sock


@contextlib.contextmanager
def zmq_ctx(socket_type, addr):
    ctx = zmq.Context()
    try:
        yield make_zmq_socket(ctx, addr, socket_type, bind=socket_type == zmq.ROUTER)
    finally:
        ctx.destroy(linger=0)


class Envs:
    """vLLM's envs module, seed era."""

    VLLM_MORIIO_CONNECTOR_READ_MODE = False
    VLLM_MORIIO_QP_PER_TRANSFER = 1
    VLLM_MORIIO_POST_BATCH_SIZE = -1
    VLLM_MORIIO_NUM_WORKERS = 1


def _torch(use_torch):
    if use_torch:
        import torch
        return torch
    return types.SimpleNamespace(Tensor=object)  # only the annotations need it


def seed_segments(path: str = SEED) -> list:
    """The two classes' source texts, exactly as in the seed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("class "))
    body = "".join(lines[first:])
    tree = ast.parse(body)
    found = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    missing = [c for c in CLASSES if c not in found]
    if missing:
        raise LookupError(f"{path} has no class {missing}")
    return [ast.get_source_segment(body, found[c]) for c in CLASSES]


def seed_source(path: str = SEED) -> str:
    return "\n\n".join(seed_segments(path)) + "\n"


def load(path: str = SEED, use_torch: bool = False) -> types.SimpleNamespace:
    """Executes the seed's classes; returns a namespace with them and the stand-ins (torch
    itself with use_torch, else a stand-in for the annotations)."""
    io = ferry.mori
    ns = {
        # mori.io, as the seed imports it
        "EngineDesc": io.EngineDesc, "IOEngine": io.IOEngine, "MemoryDesc": io.MemoryDesc,
        "PollCqMode": io.PollCqMode, "RdmaBackendConfig": io.RdmaBackendConfig,
        # the standard library and third-party modules the seed imports
        "threading": threading, "Any": Any, "zmq": zmq, "msgpack": msgpack, "Queue": Queue,
        "Empty": Empty, "weakref_ref": weakref_ref, "torch": _torch(use_torch),
        # vLLM's names
        "logger": logging.getLogger("vllm.moriio"), "envs": Envs, "ROLE": ROLE,
        "get_role": get_role, "MoRIIOConstants": MoRIIOConstants, "MoRIIOError": MoRIIOError,
        "HandshakeError": HandshakeError, "TransferError": TransferError,
        "WriteTask": WriteTask, "LayerTransferPlan": LayerTransferPlan,
        "RemoteAllocInfo": RemoteAllocInfo, "MoRIIOAgentMetadata": MoRIIOAgentMetadata,
        "get_port_offset": get_port_offset, "make_zmq_path": make_zmq_path,
        "make_zmq_socket": make_zmq_socket, "zmq_ctx": zmq_ctx,
        "__name__": "moriio_engine_seed",
    }
    exec(compile(seed_source(path), path, "exec"), ns)
    out = types.SimpleNamespace(**{k: v for k, v in ns.items() if not k.startswith("__")})
    out.set_role = set_role
    return out
