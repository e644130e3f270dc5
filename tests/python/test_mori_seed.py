"""vLLM's MoRIIOWrapper and MoRIIOWriter (the seed, executed unchanged on ferry.mori) move a
prefill's KV cache to a decode process on loopback, in write mode and in read mode; every
byte of the decode side's cache is checked (mori_peer.py runs each side)."""

import importlib.util
import json
import os
import queue
import random
import subprocess
import sys
import threading

import pytest

pytest.importorskip("zmq", reason="the seed's MoRIIO code imports zmq (python3-zmq)")
import mori_seed  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(mori_seed.SEED),
                                reason=f"the seed {mori_seed.SEED} is not here")

HERE = os.path.dirname(os.path.abspath(__file__))


def _array_kinds():
    """torch tensors where torch is importable, numpy arrays always."""
    return (["torch"] if importlib.util.find_spec("torch") else []) + ["numpy"]


class Child:
    """A mori_peer.py process: JSON commands in, one JSON reply each."""

    def __init__(self, role, mode, arrays):
        self.role = role
        # The seed asks for PollCqMode.POLLING, a spinning core per engine; the environment
        # beats it, so that two children do not take a small test machine's every core.
        env = dict(os.environ, FERRY_UCX_PROGRESS="event")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "mori_peer.py"), role, mode, arrays],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE, env=env)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.info = self._reply(60)["ready"]

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _reply(self, timeout_s):
        line = self.lines.get(timeout=timeout_s)
        assert line is not None, f"{self.role} exited with {self.proc.wait()}"
        reply = json.loads(line)
        assert "error" not in reply, f"{self.role}: {reply['error']}"
        return reply

    def call(self, cmd, timeout_s=60, **args):
        self.proc.stdin.write(json.dumps(dict(args, cmd=cmd)) + "\n")
        self.proc.stdin.flush()
        return self._reply(timeout_s)

    def close(self):
        try:
            if self.proc.poll() is None:
                self.call("exit", timeout_s=10)
            assert self.proc.wait(timeout=10) == 0
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def pair(request):
    made = []

    def make(mode, arrays):
        prefill, decode = Child("prefill", mode, arrays), Child("decode", mode, arrays)
        made.extend([prefill, decode])
        prefill.call("peer", peer=decode.info)
        decode.call("peer", peer=prefill.info)
        return prefill, decode

    yield make
    for child in made:
        child.close()


def _requests(count, seed):
    """{request id: (prefill blocks, decode blocks)}: shuffled, never sharing a block."""
    rng = random.Random(seed)
    p_free, d_free = rng.sample(range(12), 12), rng.sample(range(16), 16)
    out = {}
    for i in range(count):
        n = 1 + i % 3
        out[f"cmpl-{seed}-{i}"] = ([p_free.pop() for _ in range(n)], [d_free.pop() for _ in range(n)])
    return out


@pytest.mark.parametrize("arrays", _array_kinds())
def test_write_mode_with_deferred_layers(pair, arrays):
    prefill, decode = pair("write", arrays)
    reqs = _requests(4, seed=7)
    early = dict(list(reqs.items())[:2])  # layer tasks before the allocation: deferred
    late = dict(list(reqs.items())[2:])   # the allocation arrives first

    got = prefill.call("schedule", requests={r: p for r, (p, _) in early.items()},
                       expect_deferred=True)
    assert got["deferred"] == len(early) * 3
    decode.call("allocate", requests={r: d for r, (_, d) in reqs.items()})
    assert prefill.call("await_alloc", requests=list(late))["ok"]
    prefill.call("schedule", requests={r: p for r, (p, _) in late.items()})

    written = decode.call("await_written", requests=reqs)
    assert written["ok"], written
    assert written["bad"] == []
    sent = prefill.call("await_sent", requests=list(reqs))
    assert sent["ok"] and sent["done"] == sorted(reqs)


@pytest.mark.parametrize("arrays", _array_kinds())
def test_read_mode(pair, arrays):
    prefill, decode = pair("read", arrays)
    reqs = _requests(5, seed=11)
    got = decode.call("read", requests=reqs)
    assert got["bad"] == []
    sent = prefill.call("await_sent", requests=list(reqs))
    assert sent["ok"] and sent["done"] == sorted(reqs)


def test_seed_runs_unchanged():
    """What runs is the seed's text: both classes, byte for byte."""
    with open(mori_seed.SEED, encoding="utf-8") as f:
        text = f.read()
    segments = mori_seed.seed_segments()
    assert [s.split(":")[0] for s in segments] == ["class MoRIIOWrapper", "class MoRIIOWriter"]
    for segment in segments:
        assert segment in text and len(segment) > 1000
    ns = mori_seed.load()
    assert ns.MoRIIOWrapper.__module__ == "moriio_engine_seed"
    assert ns.MoRIIOWrapper.write_remote_data.__code__.co_filename == mori_seed.SEED
