"""ferry.ple_bridge: vLLM's PLE offload protocol served by `ferry embed-serve`.

Everywhere (CPU): vLLM's wire messages decoded (the registration as ForkingPickler writes it,
the request as msgspec writes it); then the bridge and the service as child processes, with
this process in the connector's role over CPU output buffers and flags: 2 data-parallel x 2
tensor-parallel ranks, every row of every rank checked against ferry's reference
(ferry.embed), the flag protocol (wait for 0, rows, then 1; vLLM resets to 0), READY over
vLLM's pipe, and the error paths: malformed frames are rejected and serving goes on, a step
ferry fails gets FLAG_FAILED (never DONE), bad registrations fail READY, a flag never reset
stops the bridge; every wait has a deadline.

The GPU path's stream operations (wait for 0, copy, write 1 or 2) over a stand-in driver on
host memory. GPU (test_gpu_seed_connector, the work in ple_gpu.py): the seed's
PleOffloadConnector executed unchanged against the bridge; skipped, with the reason printed,
where torch.cuda is not available.

zmq: pyzmq where it imports, else (or with FERRY_TEST_ZMQ_STANDIN=1) tests/python/zmq_standin in
this process and in the bridge child alike; a run on the stand-in says so in the warnings.
"""

import os
import pickle
import random
import sys
import threading
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="vLLM's registration pickles torch tensors")

import ferry  # noqa: E402
# ple_helpers first: it finds zmq (pyzmq, else tests/python/zmq_standin) for ferry.ple_bridge.
from ple_helpers import (  # noqa: E402
    E, LAYER_NAMES, LAYERS, MAX_REQS, MAX_TOKENS, N, TOKEN_BYTES, V, ZMQ_STANDIN, Service,
    child_env, expected_rows, install_vllm_protocol, make_step, start_bridge, use_zmq,
    wait_value, zmq,
)
from ferry import ple_bridge  # noqa: E402
from multiprocessing.reduction import ForkingPickler  # noqa: E402
import torch.multiprocessing as torch_mp  # noqa: E402

proto = None  # vLLM's protocol module (stand-in), entered into sys.modules for each test

if ZMQ_STANDIN:  # said once per run, in pytest's warnings summary and on stderr
    print(f"test_ple_bridge: {ZMQ_STANDIN}", file=sys.stderr)
    warnings.warn(f"test_ple_bridge: {ZMQ_STANDIN}")


@pytest.fixture(autouse=True)
def vllm_protocol(monkeypatch):
    global proto
    use_zmq(monkeypatch.setitem)
    proto = install_vllm_protocol(monkeypatch.setitem)
    yield proto


def dumps(obj):
    """As the seed's _register_with_offload_worker: ForkingPickler under file_system."""
    old = torch_mp.get_sharing_strategy()
    torch_mp.set_sharing_strategy("file_system")
    try:
        return bytes(ForkingPickler.dumps(obj))
    finally:
        torch_mp.set_sharing_strategy(old)


class Worker:
    """One vLLM GPU worker's side, over CPU tensors: its registration and (TP0) inputs."""

    def __init__(self, ctx, ipc, dp, tp, tp_size):
        self.dp, self.tp = dp, tp
        self.outputs = {n: torch.zeros(MAX_TOKENS, E, dtype=torch.bfloat16).share_memory_()
                        for n in LAYER_NAMES}
        self.flags = {n: torch.zeros(1, dtype=torch.int32).share_memory_() for n in LAYER_NAMES}
        self.ids = torch.zeros(MAX_TOKENS, dtype=torch.int32).share_memory_()
        self.qsl = torch.zeros(MAX_REQS + 1, dtype=torch.int32).share_memory_()
        self.ctx = torch.zeros(MAX_REQS, N - 1, dtype=torch.int32).share_memory_()
        self.reg = proto.PleOffloadRegistration(
            worker_id=dp * tp_size + tp, tp_rank=tp, dp_rank=dp,
            gpu_output_buffers=self.outputs, sem_flag_tensors=self.flags, input_ids_buf=self.ids,
            query_start_loc_buf=self.qsl, ngram_context_buf=self.ctx)
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(ipc)

    def register(self):
        self.sock.send(dumps(self.reg))

    def send_step(self, step):
        """TP0: stage the inputs in the shared buffers, then send the request."""
        tokens, qsl, ctx = step
        r, n = len(qsl) - 1, len(tokens)
        self.ids[:n] = torch.tensor(tokens, dtype=torch.int32)
        self.qsl[: r + 1] = torch.tensor(qsl, dtype=torch.int32)
        self.ctx[:r] = torch.tensor(ctx, dtype=torch.int32).reshape(r, N - 1)
        self.sock.send(ple_bridge.encode_request(ple_bridge.PleOffloadRequest(self.dp, n, r)))

    def flag(self, name):
        return int(self.flags[name][0])

    def check_and_release(self, step, want_flag=ple_bridge.FLAG_DONE):
        """The GPU forward's part: wait for each layer's flag, read its rows, then reset."""
        tokens, qsl, ctx = step
        n = len(tokens)
        for name, layer in zip(LAYER_NAMES, LAYERS):
            wait_value(lambda: self.flag(name), want_flag, 20, f"dp {self.dp} tp {self.tp} {name}")
            if want_flag == ple_bridge.FLAG_DONE:
                got = self.outputs[name][:n].view(torch.int16).numpy().tobytes()
                assert got == expected_rows(layer, tokens, qsl, ctx), f"{name}: rows differ"
        for name in LAYER_NAMES:
            self.flags[name][0] = ple_bridge.FLAG_RESET


@pytest.fixture
def service(tmp_path):
    s = Service(tmp_path)
    yield s
    s.stop()


def run_bridge(tmp_path, service, dp_size, tp_size, *args):
    """Bridge, workers registered, READY checked; returns (bridge, workers[dp][tp], ctx)."""
    bridge = start_bridge(tmp_path, service.socket, dp_size * tp_size, *args)
    ctx = zmq.Context()
    workers = [[Worker(ctx, bridge.ipc, dp, tp, tp_size) for tp in range(tp_size)]
               for dp in range(dp_size)]
    for group in workers:
        for w in group:
            w.register()
    assert bridge.wait_for_ready(30) == sorted(LAYER_NAMES)
    return bridge, workers, ctx


def close(bridge, workers, ctx):
    for group in workers:
        for w in group:
            w.sock.close(0)
    ctx.term()
    rc = bridge.stop(20)
    return rc, bridge.log.read_text()


def test_the_bridge_child_imports_the_same_zmq():
    """The bridge runs as `python3 -m ferry.ple_bridge`: its zmq must be the test's (pyzmq, or
    the stand-in on both ends; the two do not speak to each other)."""
    import subprocess
    code = "import zmq, ferry.ple_bridge as b; print(getattr(b.zmq, 'STANDIN', False))"
    r = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(bool(ZMQ_STANDIN))
    assert getattr(ple_bridge.zmq, "STANDIN", False) == bool(ZMQ_STANDIN)


# --- messages ---------------------------------------------------------------------------------

def test_request_bytes_as_msgspec_writes_them():
    b = ple_bridge.encode_request(ple_bridge.PleOffloadRequest(0, 17, 3))
    assert b == bytes.fromhex("83a7") + b"dp_rank" + b"\x00\xaa" + b"num_tokens" + b"\x11\xa8" \
        + b"num_reqs" + b"\x03"
    assert ple_bridge.decode_request(b) == ple_bridge.PleOffloadRequest(0, 17, 3)
    extra = ple_bridge.msgpack.packb({"num_reqs": 1, "x": [1], "dp_rank": 2, "num_tokens": 5})
    assert ple_bridge.decode_request(extra) == ple_bridge.PleOffloadRequest(2, 5, 1)


@pytest.mark.parametrize("frame", [
    b"", b"\xc1", b"\x93\x00\x01\x02", ple_bridge.msgpack.packb({"dp_rank": 0, "num_tokens": 1}),
    ple_bridge.msgpack.packb({"dp_rank": -1, "num_tokens": 1, "num_reqs": 1}),
    ple_bridge.msgpack.packb({"dp_rank": 0, "num_tokens": "1", "num_reqs": 1}),
    ple_bridge.msgpack.packb({"dp_rank": True, "num_tokens": 1, "num_reqs": 1}),
    ple_bridge.msgpack.packb({"dp_rank": 0, "num_tokens": 2**40, "num_reqs": 1}),
    ple_bridge.msgpack.packb({1: 0}),
])
def test_malformed_requests_are_rejected(frame):
    with pytest.raises(ple_bridge.ProtocolError):
        ple_bridge.decode_request(frame)


def test_registration_decodes_to_the_shared_tensors():
    w = Worker(zmq.Context.instance(), "inproc://unused", 1, 0, 1)
    frame = dumps(w.reg)
    reg = ple_bridge.decode_registration(frame)
    assert isinstance(reg, ple_bridge.PleOffloadRegistration)
    assert (reg.dp_rank, reg.tp_rank, reg.worker_id) == (1, 0, 1)
    assert list(reg.gpu_output_buffers) == LAYER_NAMES
    out = reg.gpu_output_buffers[LAYER_NAMES[0]]
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (MAX_TOKENS, E)
    w.ids[:3] = torch.tensor([7, 8, 9], dtype=torch.int32)  # written after pickling, as vLLM
    assert reg.input_ids_buf[:3].tolist() == [7, 8, 9]
    reg.sem_flag_tensors[LAYER_NAMES[1]][0] = 1  # the same memory, both ways
    assert w.flag(LAYER_NAMES[1]) == 1
    w.sock.close(0)


def evil():
    return os.system  # pickles as a global; the bridge must not resolve it


@pytest.mark.parametrize("frame,what", [
    (b"\x80\x04garbage", "does not decode"),
    (pickle.dumps(os.system, protocol=4), "never refers to"),
    (pickle.dumps({"worker_id": 0}, protocol=4), "is a dict"),
    (b"\x83\xa7dp_rank", "not a pickle"),
])
def test_malformed_registrations_are_rejected(frame, what):
    with pytest.raises(ple_bridge.ProtocolError) as e:
        ple_bridge.decode_registration(frame)
    assert what in str(e.value)


def test_registration_fields_are_checked():
    w = Worker(zmq.Context.instance(), "inproc://unused", 0, 0, 1)
    w.reg.sem_flag_tensors[LAYER_NAMES[0]] = torch.zeros(2, dtype=torch.int32).share_memory_()
    with pytest.raises(ple_bridge.ProtocolError, match="int32 tensor of one element"):
        ple_bridge.decode_registration(dumps(w.reg))
    w.reg.sem_flag_tensors = {"other": w.flags[LAYER_NAMES[0]]}
    with pytest.raises(ple_bridge.ProtocolError, match="name different layers"):
        ple_bridge.decode_registration(dumps(w.reg))
    w.sock.close(0)


# --- the bridge and the service, CPU outputs --------------------------------------------------

def test_two_dp_by_two_tp_steps(tmp_path, service):
    bridge, workers, ctx = run_bridge(tmp_path, service, 2, 2)
    errors = []

    def run(dp):
        try:
            rng = random.Random(dp)
            for num_reqs, num_tokens, pad in [(4, 200, 0), (16, 16, 8), (3, 60, 4), (1, 1, 0)]:
                step = make_step(rng, num_reqs, num_tokens, pad)
                workers[dp][0].send_step(step)
                for w in workers[dp]:  # every TP rank gets the same rows
                    w.check_and_release(step)
        except Exception as e:  # reported on the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(dp,)) for dp in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    rc, log = close(bridge, workers, ctx)
    assert rc == 0, log
    assert "8 steps, 0 failed, 0 frames rejected" in log
    assert "2 registrations, 8 steps, 0 failed" in service.stop()  # one ferry client per DP


def test_waits_for_vllm_to_release_before_writing(tmp_path, service):
    bridge, workers, ctx = run_bridge(tmp_path, service, 1, 1)
    w, rng = workers[0][0], random.Random(5)
    s1 = make_step(rng, 2, 20)
    w.send_step(s1)
    wait_value(lambda: w.flag(LAYER_NAMES[-1]), 1, 20, "step 1")
    before = w.outputs[LAYER_NAMES[0]].view(torch.int16).clone()
    s2 = make_step(rng, 2, 20)
    w.send_step(s2)  # sent before vLLM released step 1 (MRV2 runs ahead)
    time.sleep(0.3)
    assert torch.equal(w.outputs[LAYER_NAMES[0]].view(torch.int16), before), "overwritten"
    assert w.flag(LAYER_NAMES[0]) == 1
    w.check_and_release(s1)  # checks step 1's rows are still there, then resets
    w.check_and_release(s2)
    rc, log = close(bridge, workers, ctx)
    assert rc == 0, log


def test_bad_frames_and_failed_steps_then_serving_goes_on(tmp_path, service):
    bridge, workers, ctx = run_bridge(tmp_path, service, 1, 2)
    w0, rng = workers[0][0], random.Random(9)
    bad = [b"\xc1", b"not msgpack at all", ple_bridge.msgpack.packb([0, 1, 1]),
           ple_bridge.msgpack.packb({"dp_rank": 7, "num_tokens": 1, "num_reqs": 1}),  # no dp 7
           dumps(w0.reg)]  # a registration after READY
    for frame in bad:
        w0.sock.send(frame)
    w0.sock.send_multipart([ple_bridge.encode_request(ple_bridge.PleOffloadRequest(0, 1, 1)), b"x"])
    # A step ferry refuses (an id >= V): the flags say FAILED, never DONE, on every TP rank.
    step = make_step(rng, 2, 10)
    step[0][3] = V
    w0.send_step(step)
    for w in workers[0]:
        w.check_and_release(step, want_flag=ple_bridge.FLAG_FAILED)
    # A step past the registered capacity: FAILED too, nothing sent to the service.
    w0.sock.send(ple_bridge.encode_request(ple_bridge.PleOffloadRequest(0, MAX_TOKENS + 1, 1)))
    for w in workers[0]:
        w.check_and_release(([0] * (MAX_TOKENS + 1), [0, 1], [0] * (N - 1)),
                            want_flag=ple_bridge.FLAG_FAILED)
    good = make_step(rng, 3, 40, 2)
    w0.send_step(good)
    for w in workers[0]:
        w.check_and_release(good)
    rc, log = close(bridge, workers, ctx)
    assert rc == 0, log
    assert "1 steps, 2 failed, 6 frames rejected" in log, log
    assert log.count("rejected a frame") == 6


def test_flag_never_reset_stops_the_bridge(tmp_path, service):
    bridge, workers, ctx = run_bridge(tmp_path, service, 1, 1, "--step-timeout", "1")
    w, rng = workers[0][0], random.Random(3)
    s = make_step(rng, 1, 4)
    w.send_step(s)
    wait_value(lambda: w.flag(LAYER_NAMES[-1]), 1, 20, "step 1")
    w.send_step(make_step(rng, 1, 4))  # vLLM never releases step 1
    assert bridge.proc.wait(20) == 1
    assert "did not reset a flag" in bridge.log.read_text()
    close(bridge, workers, ctx)


def test_registration_errors_fail_ready(tmp_path, service):
    # Too few registrations: FAILURE by the deadline.
    bridge = start_bridge(tmp_path, service.socket, 2, "--ready-timeout", "3")
    ctx = zmq.Context()
    w = Worker(ctx, bridge.ipc, 0, 0, 2)
    w.register()
    with pytest.raises(RuntimeError, match="1 of 2 registrations"):
        bridge.wait_for_ready(20)
    assert bridge.proc.wait(20) == 1
    w.sock.close(0)
    # The same rank twice.
    bridge = start_bridge(tmp_path, service.socket, 2)
    w = Worker(ctx, bridge.ipc, 0, 0, 1)
    w.register()
    w.register()
    with pytest.raises(RuntimeError, match="registered twice"):
        bridge.wait_for_ready(20)
    w.sock.close(0)
    # A pickle that names something else than vLLM's registration.
    bridge = start_bridge(tmp_path, service.socket, 1)
    w = Worker(ctx, bridge.ipc, 0, 0, 1)
    w.sock.send(pickle.dumps(evil, protocol=4))
    with pytest.raises(RuntimeError, match="never refers to"):
        bridge.wait_for_ready(20)
    w.sock.close(0)
    # Layers the service does not serve (--layers 0 5).
    bridge = start_bridge(tmp_path, service.socket, 1, "--layers", "0", "5")
    w = Worker(ctx, bridge.ipc, 0, 0, 1)
    w.register()
    with pytest.raises(RuntimeError, match="NOT_FOUND"):
        bridge.wait_for_ready(20)
    w.sock.close(0)
    ctx.term()


def test_no_service_fails_ready(tmp_path):
    bridge = start_bridge(tmp_path, str(tmp_path / "absent.sock"), 1, "--connect-timeout", "1")
    ctx = zmq.Context()
    w = Worker(ctx, bridge.ipc, 0, 0, 1)
    w.register()
    with pytest.raises(RuntimeError, match="UNAVAILABLE"):
        bridge.wait_for_ready(30)
    w.sock.close(0)
    ctx.term()


def test_gpu_seed_connector(tmp_path, monkeypatch):
    """The seed's PleOffloadConnector, unchanged, against the bridge (ple_gpu.py)."""
    import ple_gpu
    reason = ple_gpu.unavailable()
    if reason:
        print(f"skipped: {reason}")
        pytest.skip(reason)
    ple_gpu.run_seed_connector(tmp_path, monkeypatch)


class FakeStreams:
    """The driver calls of the GPU path, over host memory: a stream's operations run, in order,
    when it is queried (a WaitValue32 that does not hold stops it there)."""

    def __init__(self):
        self.ops, self.log = [], []

    def use_device(self, device):
        pass

    def check(self, rc, what):
        assert rc == 0, what

    def cuStreamCreate(self, stream, flags):
        return 0

    def cuStreamDestroy(self, stream):
        return 0

    def cuStreamWaitValue32(self, stream, addr, value, flags):
        self.ops.append(("wait", addr, value, flags))
        return 0

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        self.ops.append(("copy", dst, src, n))
        return 0

    def cuStreamWriteValue32(self, stream, addr, value, flags):
        self.ops.append(("write", addr, value, flags))
        return 0

    def cuStreamQuery(self, stream):
        import ctypes
        while self.ops:
            op = self.ops[0]
            word = ctypes.c_int32.from_address(op[1])
            if op[0] == "wait" and (op[3] != 1 or word.value != op[2]):
                return 600  # EQ (flags 1) not yet true
            if op[0] == "copy":
                ctypes.memmove(op[1], op[2], op[3])
            if op[0] == "write":
                word.value = op[2]
            self.log.append(op[0] if op[0] != "write" else f"write {op[2]}")
            self.ops.pop(0)
        return 0


def test_cuda_target_orders_wait_copy_write():
    from types import SimpleNamespace as NS
    drv = FakeStreams()
    out = np.zeros((8, TOKEN_BYTES), np.uint8)
    flag = np.ones(1, np.int32)  # vLLM has not released the previous step yet
    t = ple_bridge._CudaTarget(
        drv, NS(device=NS(index=0), data_ptr=lambda: out.ctypes.data),
        NS(device=NS(index=0), data_ptr=lambda: flag.ctypes.data), TOKEN_BYTES)
    rows = np.arange(8 * TOKEN_BYTES, dtype=np.uint32).astype(np.uint8).reshape(8, TOKEN_BYTES)
    t.put(rows, 5, True, time.monotonic() + 5)
    with pytest.raises(TimeoutError, match="did not reset a flag"):
        t.finish(time.monotonic() + 0.05)
    assert not out.any() and flag[0] == 1  # nothing written before the reset
    flag[0] = ple_bridge.FLAG_RESET  # vLLM's release_outputs
    t.finish(time.monotonic() + 5)
    assert drv.log == ["wait", "copy", "write 1"]
    assert out[:5].tobytes() == rows[:5].tobytes() and not out[5:].any()
    assert flag[0] == ple_bridge.FLAG_DONE
    flag[0] = ple_bridge.FLAG_RESET
    t.put(rows, 5, False, time.monotonic() + 5)  # a failed step: no rows, FLAG_FAILED
    t.finish(time.monotonic() + 5)
    assert drv.log[3:] == ["wait", "write 2"] and flag[0] == ple_bridge.FLAG_FAILED


def test_service_lost_stops_the_bridge(tmp_path, service):
    bridge, workers, ctx = run_bridge(tmp_path, service, 1, 2)
    w0, rng = workers[0][0], random.Random(4)
    good = make_step(rng, 2, 30)
    w0.send_step(good)
    for w in workers[0]:
        w.check_and_release(good)
    service.stop()
    w0.send_step(make_step(rng, 2, 30))  # the flags say FAILED, then the bridge stops
    for w in workers[0]:
        for name in LAYER_NAMES:
            wait_value(lambda: w.flag(name), ple_bridge.FLAG_FAILED, 20, name)
    assert bridge.proc.wait(20) == 1
    assert "UNAVAILABLE" in bridge.log.read_text()
    close(bridge, workers, ctx)
