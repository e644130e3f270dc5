"""Helpers of test_ple_bridge.py: ferry embed-serve and the bridge as child processes, vLLM's
protocol dataclasses under vLLM's module name (so that pickles name them as vLLM's do), and
the expected rows from ferry's own reference (ferry.embed: row ids, synthetic rows)."""

import dataclasses
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
import uuid

import numpy as np
import pytest

ZMQ_STANDIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zmq_standin")


def _load_zmq():
    """(zmq module, why the stand-in is used or None). Real pyzmq whenever it imports, unless
    FERRY_TEST_ZMQ_STANDIN=1 forces tests/python/zmq_standin (pure Python, both ends)."""
    if os.environ.get("FERRY_TEST_ZMQ_STANDIN") != "1":
        try:
            import zmq
            return zmq, None
        except ImportError as e:
            why = f"pyzmq is not importable ({e})"
    else:
        why = "FERRY_TEST_ZMQ_STANDIN=1"
    # Loaded without entering sys.modules for good: other tests (test_mori) must still see
    # that there is no real zmq. use_zmq() enters it for one test at a time.
    spec = importlib.util.spec_from_file_location(
        "zmq", os.path.join(ZMQ_STANDIN_DIR, "zmq", "__init__.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, f"{why}: using ferry's zmq stand-in ({ZMQ_STANDIN_DIR})"


zmq, ZMQ_STANDIN = _load_zmq()


def use_zmq(setitem):
    """Makes `import zmq` give this module's zmq (through pytest's monkeypatch.setitem, undone
    after the test): vLLM's seed imports it."""
    if ZMQ_STANDIN:
        setitem(sys.modules, "zmq", zmq)


# ferry.ple_bridge imports zmq at its top: it gets the same zmq as the test.
_saved = sys.modules.get("zmq")
sys.modules["zmq"] = zmq
try:
    from ferry import embed, ple_bridge
finally:
    if _saved is None:
        del sys.modules["zmq"]
    else:
        sys.modules["zmq"] = _saved
from test_embed_service import ferry_bin  # noqa: E402

# A small model: V tokens, EOS, N-grams, H heads per order, E values per token (bf16).
V, EOS, N, H, E, B, P = 1000, 2, 3, 2, 64, 97, 8
G = (N - 1) * H
ROW_BYTES = E // G * 2
TOKEN_BYTES = E * 2
LAYER_NAMES = ["model.layers.1.ple", "model.layers.3.ple"]  # vLLM's module names
LAYERS = [0, 1]  # ferry's layer index of each (vLLM's position in ple_layer_ids)
MAX_TOKENS, MAX_REQS = 256, 16
LAYOUTS = {
    l: embed.Layout(embed.Config(vocab_size=V, eos_id=EOS, ngram_size=N, heads_per_ngram=H,
                                 embed_dim=E, base_vocab=B, row_padding=P, layer=l))
    for l in LAYERS
}


def install_vllm_protocol(setitem):
    """vllm.v1.ple_offload.protocol with vLLM's two dataclasses (fields as upstream), entered
    into sys.modules through `setitem` (pytest's monkeypatch.setitem: undone after the test)."""
    name = ple_bridge.VLLM_PROTOCOL
    mod = types.ModuleType(name)

    @dataclasses.dataclass
    class PleOffloadRegistration:
        worker_id: int
        tp_rank: int
        dp_rank: int
        gpu_output_buffers: dict
        sem_flag_tensors: dict
        input_ids_buf: object
        query_start_loc_buf: object
        ngram_context_buf: object

    @dataclasses.dataclass
    class PleOffloadRequest:
        dp_rank: int
        num_tokens: int
        num_reqs: int

    for cls in (PleOffloadRegistration, PleOffloadRequest):
        cls.__module__, cls.__qualname__ = name, cls.__name__
        setattr(mod, cls.__name__, cls)
    install_module(setitem, mod)
    return mod


def install_module(setitem, mod):
    """Enters mod, and empty parents where there are none, into sys.modules."""
    parts = mod.__name__.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if parent not in sys.modules:
            setitem(sys.modules, parent, types.ModuleType(parent))
    setitem(sys.modules, mod.__name__, mod)


def expected_rows(layer, tokens, qsl, ctx):
    """The step's output rows (bytes) from ferry's reference: row ids, then synthetic rows."""
    ids = LAYOUTS[layer].row_ids(np.array(tokens, np.int32), np.array(qsl, np.int32),
                                 np.array(ctx, np.int32).reshape(-1, N - 1))
    zero = bytes(ROW_BYTES)
    return b"".join(zero if r == embed.PADDING_ROW else embed.synthetic_row(int(r), ROW_BYTES)
                    for r in ids.reshape(-1))


def make_step(rng, num_reqs, num_tokens, pad=0):
    """A step's tokens (some EOS, some negative), query starts and context; `pad` more tokens
    past the last request (CUDA-graph padding)."""
    lens = [num_tokens // num_reqs] * num_reqs
    lens[-1] += num_tokens - sum(lens)
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)

    def token():
        k = rng.random()
        return EOS if k < 0.05 else -1 if k < 0.07 else rng.randrange(0, V)

    tokens = [token() for _ in range(num_tokens + pad)]
    ctx = [token() for _ in range(num_reqs * (N - 1))]
    return tokens, qsl, ctx


class Service:
    """`ferry embed-serve` of the model above (synthetic bf16 table), host mode."""

    def __init__(self, tmp_path):
        self.socket = str(tmp_path / "embed.sock")
        ready = tmp_path / "embed.ready"
        self.log = tmp_path / "embed.log"
        args = [ferry_bin(), "embed-serve", "--socket", self.socket, "--ready-file", str(ready),
                "--vocab", str(V), "--eos", str(EOS), "--ngram", str(N), "--heads", str(H),
                "--embed-dim", str(E), "--base-vocab", str(B), "--padding", str(P),
                "--layers", *map(str, LAYERS), "--threads", "2", "--wait-timeout", "5",
                "--uva", "off"]
        self.proc = subprocess.Popen(args, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"ferry embed-serve did not start: {self.log.read_text()}")
            time.sleep(0.01)

    def stop(self):
        """Stops the service; its log (with the step counters it prints at exit)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text()


def child_env():
    """The environment of a child that imports ferry and zmq: this process's sys.path, with the
    zmq stand-in first when this process uses it (so the child's `import zmq` gets it too)."""
    path = ([ZMQ_STANDIN_DIR] if ZMQ_STANDIN else []) + sys.path
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


def start_bridge(tmp_path, socket, num_workers, *args):
    """The bridge as a child process (ferry.ple_bridge.spawn), its log in tmp_path."""
    # As vLLM's get_open_zmq_ipc_path: a short path (a Unix socket's is at most 107 bytes).
    ipc = f"ipc://{tempfile.gettempdir()}/ferry-ple-{uuid.uuid4().hex[:12]}.ipc"
    log = tmp_path / "bridge.log"
    p = ple_bridge.spawn(ipc, socket, num_workers,
                         args=["--step-timeout", "10", "--ready-timeout", "30", *args],
                         stdout=open(log, "a"), stderr=subprocess.STDOUT, env=child_env())
    p.ipc, p.log = ipc, log
    return p


def wait_value(read, want, timeout, what):
    """Polls read() until it returns want, up to timeout seconds (no wait is unbounded)."""
    deadline = time.monotonic() + timeout
    while True:
        v = read()
        if v == want:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {v}, not {want}, after {timeout} s")
        time.sleep(0.0005)
