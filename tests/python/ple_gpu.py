"""The GPU half of test_ple_bridge.py: vLLM's PleOffloadConnector from the seed file, executed
unchanged (its module body compiled from the file's own syntax tree), against the bridge and
`ferry embed-serve`, with stand-ins for what it imports from vLLM (config, parallel groups,
logger, the PLE layer and its CUDA semaphore), for msgspec (Debian 12 has none) and, where the
cuda-python package or torch.accelerator.device_index is missing, for those. Where pyzmq is
missing (the GPU machine), the seed and the bridge both use tests/python/zmq_standin
(ple_helpers picks it; the seed's `import zmq` finds it in sys.modules for the test).

The stand-in semaphore is vLLM's: a one-element int32 CUDA tensor; signal and reset are
cuStreamWriteValue32(1 / 0), the layer's wait is cuStreamWaitValue32(== 1) on the current
stream (as vLLM's ple_offload_wait op). The test's forward reads each layer's rows after that
wait on the GPU, and never blocks without a deadline (it polls an event).
"""

import ast
import contextlib
import dataclasses
import logging
import os
import sys
import time
import types

import msgpack

import ple_helpers as H
from ferry import ple_bridge

HERE = os.path.dirname(os.path.abspath(__file__))
SEED_NAME = "ple_offload_connector_mrv2.py.txt"


def seed_path():
    """The seed: $FERRY_PLE_SEED, the shared seeds folder, else the copy beside this file."""
    for p in (os.environ.get("FERRY_PLE_SEED"), os.path.join("/work/shared/seeds", SEED_NAME),
              os.path.join(HERE, "ple_seed_mrv2.py")):
        if p and os.path.exists(p):
            return p
    return None


def unavailable():
    """Why the GPU test cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not importable"
    if not torch.cuda.is_available():
        return "torch.cuda is not available (no GPU or a CPU-only torch)"
    try:
        ple_bridge._Driver()
    except OSError as e:
        return f"the CUDA driver library does not load: {e}"
    if seed_path() is None:
        return "the seed connector_mrv2 file is not found (set FERRY_PLE_SEED)"
    return None


class _Res:
    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"CUresult({self.value})"


def install_standins(ranks, monkeypatch):
    """vLLM's, msgspec's and (where missing) cuda-python's modules the seed imports."""
    import torch
    import torch.nn as nn
    drv = ple_bridge._Driver()

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        H.install_module(monkeypatch.setitem, m)
        return m

    def encode(obj):  # msgspec.msgpack.encode of a dataclass: a map in field order
        return msgpack.packb({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})

    msgspec = mod("msgspec")
    msgspec.msgpack = mod("msgspec.msgpack", encode=encode)

    try:
        from cuda.bindings import driver as _real  # noqa: F401  (the real one, when installed)
    except ImportError:
        def register(ptr, size, flags):
            drv.use_device(torch.cuda.current_device())
            return (_Res(drv.cuMemHostRegister(ptr, size, flags)),)

        def unregister(ptr):
            drv.use_device(torch.cuda.current_device())
            return (_Res(drv.cuMemHostUnregister(ptr)),)

        cuda = mod("cuda")
        cuda.bindings = mod("cuda.bindings")
        cuda.bindings.driver = mod("cuda.bindings.driver", cuMemHostRegister=register,
                                   cuMemHostUnregister=unregister, CU_MEMHOSTREGISTER_PORTABLE=1)

    if not hasattr(getattr(torch, "accelerator", None), "device_index"):
        @contextlib.contextmanager
        def device_index(index):
            with torch.cuda.device(index):
                yield
        if hasattr(torch, "accelerator"):
            monkeypatch.setattr(torch.accelerator, "device_index", device_index, raising=False)
        else:
            monkeypatch.setattr(torch, "accelerator", types.SimpleNamespace(device_index=device_index),
                                raising=False)

    try:  # a torch built without NVTX raises here, and the seed's request thread would exit
        with torch.cuda.nvtx.range("ferry-ple-test"):
            pass
    except Exception:
        monkeypatch.setattr(torch.cuda.nvtx, "range", lambda *a, **k: contextlib.nullcontext())

    def stream_op(fn, stream, flag, value, flags):
        drv.use_device(flag.device.index)
        drv.check(fn(ctypes_stream(stream), flag.data_ptr(), value, flags), fn.__name__)

    class CpuGpuSemaphore:
        RESET_VALUE, DONE_VALUE = 0, 1

        def __init__(self, device):
            self.flag_tensor = torch.zeros(1, dtype=torch.int32, device=device)

        def signal(self, stream):
            stream_op(drv.cuStreamWriteValue32, stream, self.flag_tensor, 1, 0)

        def reset(self, stream):
            stream_op(drv.cuStreamWriteValue32, stream, self.flag_tensor, 0, 0)

        def wait_done(self, stream):  # vllm::ple_offload_wait: WaitValue32(flag, 1, EQ)
            stream_op(drv.cuStreamWaitValue32, stream, self.flag_tensor, 1, 1)

    class PleOffloadLayer(nn.Module):
        def get_offload_output_dtype(self, default):
            return default

        def setup_cross_process_offload(self, gpu_output_buffer, semaphore):
            self._is_cpu_offloaded = True
            self._gpu_output_buffer = gpu_output_buffer
            self._sem = semaphore

        def forward(self, num_tokens):
            self._sem.wait_done(torch.cuda.current_stream(self._gpu_output_buffer.device))
            return self._gpu_output_buffer[:num_tokens]

        def release_offloaded_output(self, stream):
            self._sem.reset(stream)

    group = lambda key: types.SimpleNamespace(rank_in_group=ranks[key])  # noqa: E731
    mod("vllm.config", VllmConfig=types.SimpleNamespace)
    mod("vllm.distributed.parallel_state", get_dp_group=lambda: group("dp"),
        get_tp_group=lambda: group("tp"))
    mod("vllm.logger", init_logger=logging.getLogger)
    mod("vllm.model_executor.layers.ple_offload_layer", CpuGpuSemaphore=CpuGpuSemaphore,
        PleOffloadLayer=PleOffloadLayer)
    return PleOffloadLayer


def ctypes_stream(stream):
    import ctypes
    return ctypes.c_void_p(stream.cuda_stream)


def load_seed(monkeypatch):
    """The seed module, compiled from the seed file's syntax tree as it stands. The file's
    first line names the file (`connector_mrv2.py`, an expression statement): left out."""
    path = seed_path()
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    tree.body = [n for n in tree.body
                 if not (isinstance(n, ast.Expr) and isinstance(n.value, (ast.Attribute, ast.Name)))]
    assert any(isinstance(n, ast.ClassDef) and n.name == "PleOffloadConnector" for n in tree.body)
    m = types.ModuleType("vllm_seed_connector_mrv2")
    m.__file__ = path
    H.install_module(monkeypatch.setitem, m)  # dataclasses look their module up
    exec(compile(tree, path, "exec"), m.__dict__)
    return m


def make_model(layer_cls):
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, ple):
            super().__init__()
            self.proj = nn.Identity()
            if ple:
                self.ple = layer_cls()

    inner = nn.Module()
    inner.layers = nn.ModuleList([Block(i in (1, 3)) for i in range(4)])
    root = nn.Module()
    root.model = inner  # names: model.layers.1.ple, model.layers.3.ple
    return root


def forward_and_check(conns, models, step, deadline_s=30):
    """The GPU forward's part on the current stream: every PLE layer waits for its flag (== 1),
    its rows are copied out; polled with a deadline; then each row checked and released."""
    import torch
    tokens, qsl, ctx = step
    n = len(tokens)
    got = []
    for model in models:
        for name, layer in zip(H.LAYER_NAMES, [model.model.layers[1].ple, model.model.layers[3].ple]):
            got.append((name, layer(n).clone()))
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + deadline_s
    while not done.query():
        if time.monotonic() > deadline:
            side = torch.cuda.Stream()  # unblock the stream so the process can exit, then fail
            with torch.cuda.stream(side):
                for model in models:
                    for i in (1, 3):
                        model.model.layers[i].ple._sem.flag_tensor.fill_(1)
            side.synchronize()
            raise AssertionError(f"the PLE waits did not pass in {deadline_s} s")
        time.sleep(0.001)
    for i, (name, rows) in enumerate(got):
        layer = H.LAYERS[H.LAYER_NAMES.index(name)]
        want = bytes(n * H.TOKEN_BYTES) if step[2] is None else H.expected_rows(layer, *step)
        have = rows.view(torch.int16).cpu().numpy().tobytes()
        assert have == want, f"rank {i // 2} {name}: rows differ"
    for c in conns:
        c.release_outputs()


def run_round(tmp_path, service, seed, layer_cls, ranks, mrv2):
    import torch
    import random
    tp_size = 2
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    bridge = H.start_bridge(tmp_path, service.socket, tp_size)
    conns, models = [], []
    src_dev = device if mrv2 else torch.device("cpu")
    try:
        for tp in range(tp_size):
            ranks["tp"] = tp
            cfg = types.SimpleNamespace(
                scheduler_config=types.SimpleNamespace(max_num_batched_tokens=H.MAX_TOKENS,
                                                       max_num_seqs=H.MAX_REQS),
                model_config=types.SimpleNamespace(
                    hf_text_config=types.SimpleNamespace(ngram_size=H.N, ple_embed_dim=H.E),
                    dtype=torch.bfloat16),
                parallel_config=types.SimpleNamespace(world_size=tp_size, rank=tp),
                max_concurrent_batches=2)
            srcs = dict(
                input_ids_source=torch.zeros(H.MAX_TOKENS, dtype=torch.int32, device=src_dev),
                query_start_loc_source=torch.zeros(H.MAX_REQS + 1, dtype=torch.int32, device=src_dev),
                ngram_context_source=torch.zeros(H.MAX_REQS, H.N - 1, dtype=torch.int32, device=src_dev))
            model = make_model(layer_cls)
            conns.append(seed.PleOffloadConnector(cfg, model, device, bridge.ipc, **srcs))
            conns[-1].test_sources = srcs
            models.append(model)
        assert bridge.wait_for_ready(60) == sorted(H.LAYER_NAMES)
        rng = random.Random(11 if mrv2 else 12)
        real = 0
        for num_reqs, num_tokens, pad, dummy in [(4, 200, 0, False), (16, 16, 8, False),
                                                 (2, 8, 0, True), (3, 60, 4, False), (1, 1, 0, False)]:
            step = H.make_step(rng, num_reqs, num_tokens, pad)
            tokens, qsl, ctx = step
            for c in conns:  # the runner's persistent inputs (replicated over TP ranks)
                s = c.test_sources
                s["input_ids_source"][: len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
                s["query_start_loc_source"][: len(qsl)] = torch.tensor(qsl, dtype=torch.int32)
                s["ngram_context_source"][:num_reqs] = torch.tensor(ctx, dtype=torch.int32).reshape(
                    num_reqs, H.N - 1)
            for c in conns:
                c.prepare_forward(num_reqs, len(tokens), dummy)
            forward_and_check(conns, models, (tokens, qsl, None if dummy else ctx))
            real += not dummy
    finally:
        for c in conns:
            c.close()
        rc = bridge.stop(30)
    log = bridge.log.read_text()
    assert rc == 0, log
    assert f"{real} steps, 0 failed, 0 frames rejected" in log, log
    return real


def run_seed_connector(tmp_path, monkeypatch):
    """The whole GPU test; vLLM's protocol module is in sys.modules already (the fixture)."""
    ranks = {"dp": 0, "tp": 0}
    if H.ZMQ_STANDIN:
        print(f"ple_gpu: {H.ZMQ_STANDIN}")
    H.use_zmq(monkeypatch.setitem)  # the seed's `import zmq`: the bridge's zmq
    layer_cls = install_standins(ranks, monkeypatch)
    seed = load_seed(monkeypatch)
    service = H.Service(tmp_path)
    try:
        steps = 0
        for mrv2 in (True, False):
            (tmp_path / ("mrv2" if mrv2 else "mrv1")).mkdir()
            steps += run_round(tmp_path / ("mrv2" if mrv2 else "mrv1"), service, seed, layer_cls,
                               ranks, mrv2)
    finally:
        log = service.stop()
    assert f"{steps} steps, 0 failed" in log, log
