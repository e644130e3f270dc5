"""Helpers shared by ferry's Python tests: random data, scattered ops, engine pairs."""

import itertools
import time
from dataclasses import dataclass

import numpy as np
import pytest

import ferry

_INFO = ferry.system_info()["transports"]
# Transports that carry host memory (the suite's buffers are numpy arrays), and those that carry
# notifications themselves.
TRANSPORTS = [t["name"] for t in _INFO if t["host_memory"]]
NOTIFYING = [t["name"] for t in _INFO if t["notifications"]]
_keys = itertools.count()


def random_bytes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def scattered_ops(region: int, count: int, max_piece: int, seed: int) -> np.ndarray:
    """(count, 3) uint64 ops of random sizes that never overlap on either side."""
    rng = np.random.default_rng(seed)
    slot = region // count
    remote_slots = rng.permutation(count)
    ops = np.empty((count, 3), np.uint64)
    for i in range(count):
        size = 1 + int(rng.integers(0, min(max_piece, slot)))
        ops[i, 0] = i * slot + int(rng.integers(0, slot - size + 1))
        ops[i, 1] = int(remote_slots[i]) * slot + int(rng.integers(0, slot - size + 1))
        ops[i, 2] = size
    return ops


def expect_applied(src: np.ndarray, dst: np.ndarray, ops, write: bool) -> None:
    """Every op's bytes went from src to dst (write: local -> remote, read: the reverse)."""
    for i, (lo, ro, size) in enumerate(np.asarray(ops, dtype=np.uint64).tolist()):
        s, d = (lo, ro) if write else (ro, lo)
        assert np.array_equal(src[s : s + size], dst[d : d + size]), f"op {i}"


@dataclass
class Pair:
    """Two engines restricted to one transport, a buffer registered in each, and a session
    from a's buffer to b's, set up through packed descriptors as across a side channel."""

    a: ferry.Engine
    b: ferry.Engine
    a_buf: np.ndarray
    b_buf: np.ndarray
    a_desc: ferry.MemoryDesc
    b_desc: ferry.MemoryDesc
    session: ferry.Session

    @staticmethod
    def make(transport: str, size: int, **options) -> "Pair":
        n = next(_keys)
        a = ferry.Engine(key=f"a{n}", transports=[transport], **options)
        b = ferry.Engine(key=f"b{n}", transports=[transport], **options)
        a_buf, a_desc = register_host(a, size)
        b_buf, b_desc = register_host(b, size)
        a.add_peer(b.describe().pack())
        b.add_peer(ferry.EngineDesc.unpack(a.describe().pack()))
        session = a.open_session(a_desc, ferry.MemoryDesc.unpack(b_desc.pack()))
        return Pair(a, b, a_buf, b_buf, a_desc, b_desc, session)

    def close(self) -> None:
        self.a.close()
        self.b.close()


def register_host(engine: ferry.Engine, size: int):
    """(buffer, desc): a zeroed numpy buffer registered with `engine`, from the heap, or from
    ferry.alloc_shared where the engine's transports reach only shareable memory (shm)."""
    buf = np.zeros(size, np.uint8)
    try:
        return buf, engine.register_memory(buf)
    except ferry.Error as e:
        if e.code != "UNAVAILABLE":
            raise
    buf = ferry.alloc_shared(size)
    return buf, engine.register_memory(buf)


def require_cuda():
    if not ferry.cuda_available():
        pytest.skip(f"no CUDA here: {ferry.cuda_unavailable_reason()}")


def fresh_key(prefix: str) -> str:
    return f"{prefix}{next(_keys)}"


def pop_notifications(engine: ferry.Engine, count: int, timeout_s: float = 5.0) -> list:
    """Gathers `count` notifications (or what came within timeout_s).

    Over transports that deliver notifications asynchronously (ucx), a notification can reach
    the peer's inbox just after the sender's wait() returns; the C++ conformance suite checks
    the timing, this suite what is delivered.
    """
    got = []
    deadline = time.monotonic() + timeout_s
    while True:
        got += engine.pop_notifications()
        if len(got) >= count or time.monotonic() >= deadline:
            return got
        time.sleep(0.001)
