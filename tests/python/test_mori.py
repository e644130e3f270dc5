"""ferry.mori: MoRI-IO's Python API on ferry's engine (values, descriptors, sessions,
statuses, inbound statuses, deadlines). test_mori_seed.py runs vLLM's code on it."""

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import ferry.mori as io
from util import fresh_key, random_bytes


def _engine(prefix, **options):
    e = io.IOEngine(fresh_key(prefix), io.IOEngineConfig("127.0.0.1", 0), **options)
    return e


@pytest.fixture
def engines():
    made = []

    def make(prefix="m", backend_config=None, **options):
        e = _engine(prefix, **options)
        e.create_backend(io.BackendType.RDMA, backend_config)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


@pytest.fixture
def pair(engines):
    """(a, b, a's bytes, b's bytes, a's desc, b's desc, session a -> b); only a registers b."""
    a, b = engines("a"), engines("b")
    src, dst = random_bytes(1 << 16, 1), np.zeros(1 << 16, np.uint8)
    ma, mb = a.register_torch_tensor(src), b.register_torch_tensor(dst)
    a.register_remote_engine(io.EngineDesc.unpack(b.get_engine_desc().pack()))
    s = a.create_session(io.MemoryDesc.unpack(ma.pack()), io.MemoryDesc.unpack(mb.pack()))
    assert s is not None and s.alive()
    return a, b, src, dst, ma, mb, s


def _inbound(engine, key, uid, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = engine.pop_inbound_transfer_status(key, uid)
        if st is not None:
            return st
        time.sleep(0.002)
    return None


def test_enum_values_are_mori_ios():
    assert {e.name: int(e) for e in io.BackendType} == {
        "Unknown": 0, "XGMI": 1, "RDMA": 2, "TCP": 3, "FABRIC": 4}
    assert {e.name: int(e) for e in io.MemoryLocationType} == {"Unknown": 0, "CPU": 1, "GPU": 2}
    assert {e.name: int(e) for e in io.StatusCode} == {
        "SUCCESS": 0, "INIT": 1, "IN_PROGRESS": 2, "ERR_INVALID_ARGS": 11, "ERR_NOT_FOUND": 12,
        "ERR_RDMA_OP": 13, "ERR_BAD_STATE": 14, "ERR_GPU_OP": 15}
    assert {e.name: int(e) for e in io.PollCqMode} == {"POLLING": 0, "EVENT": 1}


def test_configs_take_mori_ios_arguments():
    cfg = io.RdmaBackendConfig(2, 64, 3, io.PollCqMode.EVENT)
    assert (cfg.qp_per_transfer, cfg.post_batch_size, cfg.num_worker_threads) == (2, 64, 3)
    assert cfg.poll_cq_mode == io.PollCqMode.EVENT and cfg.enable_notification is True
    assert cfg._ferry_options() == {"lanes": 2, "post_batch": 64, "workers": 3,
                                    "progress": "event"}
    assert io.RdmaBackendConfig()._ferry_options() == {"lanes": 1, "progress": "polling"}
    c = io.IOEngineConfig(host="10.0.0.1", port=1234)
    assert (c.host, c.port) == ("10.0.0.1", 1234)


def test_backends(engines):
    e = _engine("be")
    try:
        e.create_backend(io.BackendType.RDMA, io.RdmaBackendConfig(2, 64, 1, io.PollCqMode.EVENT))
        e.create_backend(io.BackendType.RDMA)  # a second one: a warning, no change
        e.create_backend(io.BackendType.XGMI, io.XgmiBackendConfig())
        e.create_backend(io.BackendType.TCP)
        with pytest.raises(RuntimeError, match="FABRIC"):
            e.create_backend(io.BackendType.FABRIC)
        assert "ucx" in e.ferry_engine.transports
        e.remove_backend(io.BackendType.TCP)
    finally:
        e.close()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_environment_beats_configs_and_arguments_beat_both(monkeypatch):
    from_env, from_config, from_args = _free_port(), _free_port(), _free_port()
    monkeypatch.setenv("FERRY_UCX_LISTEN_PORT", str(from_env))
    e = io.IOEngine(fresh_key("env"), io.IOEngineConfig("127.0.0.1", from_config))
    try:
        e.create_backend(io.BackendType.RDMA)
        assert e.get_engine_desc().port == from_env
    finally:
        e.close()
    e = io.IOEngine(fresh_key("env"), io.IOEngineConfig("127.0.0.1", from_config),
                    listen_port=from_args)
    try:
        assert e.get_engine_desc().port == from_args
    finally:
        e.close()
    monkeypatch.delenv("FERRY_UCX_LISTEN_PORT")
    e = io.IOEngine(fresh_key("env"), io.IOEngineConfig("127.0.0.1", from_config))
    try:
        assert e.get_engine_desc().port == from_config
    finally:
        e.close()


def test_engine_desc(engines):
    e = engines("desc")
    d = e.get_engine_desc()
    assert d.key == e.ferry_engine.key and d.pid == os.getpid() and d.host == "127.0.0.1"
    assert d.port > 0 and d.hostname and d.node_id == e.ferry_engine.describe().host_id
    back = io.EngineDesc.unpack(d.pack())
    assert back == d and (back.key, back.port, back.host) == (d.key, d.port, d.host)
    packed = d.pack()
    for bad in (b"", b"garbage", packed[:-1], packed + b"x", packed[:20]):
        with pytest.raises(ValueError):
            io.EngineDesc.unpack(bad)


def test_memory_desc(engines):
    e = engines("mem")
    buf = np.zeros(4096, np.uint8)
    d = e.register_torch_tensor(buf)
    assert (d.engine_key, d.size, d.data, d.loc, d.device_id) == (
        e.ferry_engine.key, 4096, buf.ctypes.data, io.MemoryLocationType.CPU, -1)
    back = io.MemoryDesc.unpack(d.pack())
    assert back == d and back.id == d.id
    with pytest.raises(ValueError):
        io.MemoryDesc.unpack(d.pack()[:-3])
    empty = io.MemoryDesc()
    assert empty.size == 0 and empty.loc == io.MemoryLocationType.Unknown and empty != d


def test_session_batch_write_and_read(pair):
    a, b, src, dst, ma, mb, s = pair
    st = s.batch_write([0, 1000, 5000], [40000, 100, 7], [64, 900, 3], a.allocate_transfer_uid())
    st.Wait()
    assert st.Succeeded() and st.Code() == io.StatusCode.SUCCESS and st.Message() == ""
    for lo, ro, n in [(0, 40000, 64), (1000, 100, 900), (5000, 7, 3)]:
        assert np.array_equal(dst[ro:ro + n], src[lo:lo + n])
    dst[60000:60100] = 7
    st = s.read(30000, 60000, 100, a.allocate_transfer_uid())
    assert st.WaitFor(10000) == io.StatusCode.SUCCESS
    assert (src[30000:30100] == 7).all()
    st = s.write(2, 3, 4, 99)
    st.Wait()
    assert np.array_equal(dst[3:7], src[2:6])


def test_bad_batches_fail_before_any_byte_moves(pair):
    a, b, src, dst, ma, mb, s = pair
    st = s.batch_write((0, 32), (0, 1 << 16), (32, 34), 1)
    assert st.Failed() and st.Code() == io.StatusCode.ERR_INVALID_ARGS and "exceeds" in st.Message()
    assert not dst.any()
    assert s.batch_read([0], [0, 1], [1], 2).Code() == io.StatusCode.ERR_INVALID_ARGS
    assert s.batch_write([-1], [0], [1], 3).Code() == io.StatusCode.ERR_INVALID_ARGS
    assert s.batch_write([0.5], [0], [1], 3).Code() == io.StatusCode.ERR_INVALID_ARGS
    assert not dst.any()
    numpy_ints = s.batch_write(np.array([8]), np.array([16], np.uint32), np.array([4]), 3)
    assert numpy_ints.WaitFor(10000) == io.StatusCode.SUCCESS
    assert np.array_equal(dst[16:20], src[8:12])
    empty = s.batch_write([], [], [], 4)
    assert empty.Succeeded()
    with pytest.raises(ValueError):
        s.write(0, 0, 1, -5)


def test_engine_level_transfers_and_wait_all(pair):
    a, b, src, dst, ma, mb, s = pair
    st = a.write(ma, 0, mb, 100, 50, a.allocate_transfer_uid())
    assert a.wait_all([st]) == io.StatusCode.SUCCESS
    assert np.array_equal(dst[100:150], src[0:50])
    statuses = a.batch_write([ma, ma], [[0, 64], [512]], [mb, mb], [[1024, 2048], [4096]],
                             [[8, 8], [16]], [10, 11])
    assert len(statuses) == 2
    assert a.wait_all(statuses, timeout_ms=10000) == io.StatusCode.SUCCESS
    assert np.array_equal(dst[2048:2056], src[64:72]) and np.array_equal(dst[4096:4112], src[512:528])
    reads = a.batch_read([ma], [[20000]], [mb], [[100]], [[50]], [12])
    assert a.wait_all(reads) == io.StatusCode.SUCCESS and np.array_equal(src[20000:20050], dst[100:150])
    assert a.wait_all([]) == io.StatusCode.SUCCESS
    bad = a.read(ma, 0, mb, 1 << 16, 1, 13)
    assert a.wait_all([st, bad]) == io.StatusCode.ERR_INVALID_ARGS
    with pytest.raises(ValueError):
        a.batch_write([ma], [[0]], [mb, mb], [[0]], [[1]], [1])


def test_target_serves_a_peer_it_never_registered_and_learns_of_its_transfers(pair):
    a, b, src, dst, ma, mb, s = pair
    key = a.ferry_engine.key
    w = s.write(0, 0, 128, 1234)
    r = s.read(0, 0, 16, 1235)
    assert a.wait_all([w, r]) == io.StatusCode.SUCCESS
    got = _inbound(b, key, 1234)
    assert got is not None and got.Succeeded()
    assert b.pop_inbound_transfer_status(key, 1234) is None  # popped once
    assert _inbound(b, key, 1235).Succeeded()
    assert b.pop_inbound_transfer_status(key, 777) is None
    assert b.pop_inbound_transfer_status("nobody", 1234) is None


def test_inbound_statuses_off_at_the_initiator(engines):
    a = engines("quiet", io.RdmaBackendConfig(enable_notification=False))
    b = engines("b")
    src, dst = random_bytes(256, 2), np.zeros(256, np.uint8)
    ma, mb = a.register_torch_tensor(src), b.register_torch_tensor(dst)
    a.register_remote_engine(b.get_engine_desc())
    s = a.create_session(ma, mb)
    st = s.write(0, 0, 256, 5)
    st.Wait()
    assert st.Succeeded() and np.array_equal(dst, src)
    assert _inbound(b, a.ferry_engine.key, 5, timeout_s=0.3) is None


def test_full_target_backlog_loses_notices_not_transfers(engines, monkeypatch):
    monkeypatch.setattr(io, "_DRAIN_INTERVAL_S", 3600.0)  # nothing takes the notices in
    a, b = engines("a"), engines("b", max_pending_notifications=2)
    src, dst = random_bytes(4096, 3), np.zeros(4096, np.uint8)
    ma, mb = a.register_torch_tensor(src), b.register_torch_tensor(dst)
    a.register_remote_engine(b.get_engine_desc())
    s = a.create_session(ma, mb)
    statuses = [s.write(i * 64, i * 64, 64, i) for i in range(20)]
    assert a.wait_all(statuses) == io.StatusCode.SUCCESS
    assert np.array_equal(dst[:1280], src[:1280])
    deadline = time.monotonic() + 5
    while b.ferry_engine.stats()["dropped_notifications"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.ferry_engine.stats()["dropped_notifications"] > 0


def test_inbound_statuses_are_bounded(pair, monkeypatch):
    a, b, src, dst, ma, mb, s = pair
    monkeypatch.setattr(io, "MAX_INBOUND_STATUSES", 4)
    assert a.wait_all([s.write(0, 0, 8, uid) for uid in range(10)]) == io.StatusCode.SUCCESS
    assert _inbound(b, a.ferry_engine.key, 9) is not None
    assert b.pop_inbound_transfer_status(a.ferry_engine.key, 0) is None


def test_sessions_need_a_registered_remote_and_end_with_it(pair, engines):
    a, b, src, dst, ma, mb, s = pair
    c = engines("c")
    mc = c.register_torch_tensor(np.zeros(64, np.uint8))
    assert a.create_session(ma, io.MemoryDesc.unpack(mc.pack())) is None  # c not registered
    assert a.create_session(io.MemoryDesc(), mb) is None
    assert a.create_session(mb, mb) is None  # not a region of a
    st = a.write(ma, 0, mc, 0, 8, 1)
    assert st.Failed() and st.Code() == io.StatusCode.ERR_NOT_FOUND
    a.deregister_remote_engine(b.get_engine_desc())
    assert not s.alive()
    assert s.write(0, 0, 8, 2).Code() == io.StatusCode.ERR_BAD_STATE
    a.register_remote_engine(b.get_engine_desc())
    s2 = a.create_session(ma, mb)
    assert s2.alive() and s2.write(0, 0, 8, 3).WaitFor(10000) == io.StatusCode.SUCCESS
    a.deregister_memory(ma)
    assert not s2.alive()


def test_register_memory_by_pointer_and_torch_tensor(engines):
    e = engines("ptr")
    buf = random_bytes(1024, 4)
    d = e.register_memory(buf.ctypes.data, buf.nbytes, -1, io.MemoryLocationType.CPU)
    assert (d.data, d.size, d.loc) == (buf.ctypes.data, 1024, io.MemoryLocationType.CPU)
    s = e.create_session(d, d)  # this engine's own memory: no registration needed
    assert s.write(0, 512, 256, 1).WaitFor(10000) == io.StatusCode.SUCCESS
    assert np.array_equal(buf[512:768], buf[0:256])
    torch = pytest.importorskip("torch")
    t = torch.arange(64, dtype=torch.float32)
    dt = e.register_torch_tensor(t)
    assert (dt.size, dt.data, dt.loc) == (256, t.data_ptr(), io.MemoryLocationType.CPU)
    with pytest.raises(RuntimeError, match="input tensor must be contiguous"):
        e.register_torch_tensor(torch.zeros(8, 8).t())


class _DuckTensor:
    """Only the calls MoRI-IO's register_torch_tensor makes, over a numpy buffer."""

    def __init__(self, buf):
        self.buf = buf
        self.device = type("Device", (), {"type": "cpu", "index": None})()

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self.buf.ctypes.data

    def nelement(self):
        return self.buf.size

    def element_size(self):
        return self.buf.itemsize


def test_register_torch_tensor_is_duck_typed(engines):
    e = engines("duck")
    buf = np.arange(100, dtype=np.int32)
    d = e.register_torch_tensor(_DuckTensor(buf))
    assert (d.data, d.size, d.loc, d.device_id) == (buf.ctypes.data, 400, io.MemoryLocationType.CPU, -1)
    bad = _DuckTensor(buf)
    bad.device.type = "mps"
    with pytest.raises(RuntimeError, match="mps"):
        e.register_torch_tensor(bad)


class _FakeTransfer:
    """A ferry.Transfer as TransferStatus sees it, finished by hand."""

    def __init__(self):
        self.result = None

    def test(self):
        return self.result is not None

    def status(self):
        return self.result or ("IN_PROGRESS", "")

    def wait(self, timeout_ms=None):
        return self.result is not None


def test_statuses_to_one_remote_complete_in_posting_order():
    order = io._Order()
    first, second = _FakeTransfer(), _FakeTransfer()
    s1 = io.TransferStatus(io.StatusCode.IN_PROGRESS, "", first, order, order.add(first))
    s2 = io.TransferStatus(io.StatusCode.IN_PROGRESS, "", second, order, order.add(second))
    second.result = ("OK", "")
    assert s2.InProgress() and not s2.Succeeded()  # the earlier one has not ended
    assert s2.WaitFor(0) == io.StatusCode.IN_PROGRESS
    first.result = ("UNAVAILABLE", "peer gone")
    assert s1.Failed() and s1.Code() == io.StatusCode.ERR_RDMA_OP and "UNAVAILABLE" in s1.Message()
    assert s2.Succeeded()  # its own outcome, once everything before it ended
    assert not order._open


def test_transfer_status_by_hand():
    st = io.TransferStatus()
    assert st.Init() and not st.InProgress() and not st.Failed()
    st.Wait()  # returns at once from INIT
    assert st.WaitFor(-1) == io.StatusCode.INIT
    st.SetCode(io.StatusCode.IN_PROGRESS)
    st.SetMessage("going")
    assert st.InProgress() and st.Message() == "going"
    st.Update(io.StatusCode.ERR_GPU_OP, "boom")
    st.Update(io.StatusCode.SUCCESS, "fine")  # ignored once failed
    assert st.Failed() and st.Code() == io.StatusCode.ERR_GPU_OP and st.Message() == "boom"


_TARGET = """
import sys, numpy as np, ferry.mori as io
e = io.IOEngine("stopped-target", io.IOEngineConfig("127.0.0.1", 0))
e.create_backend(io.BackendType.RDMA)
buf = np.zeros(1 << 20, np.uint8)
print(e.get_engine_desc().pack().hex(), e.register_torch_tensor(buf).pack().hex(), flush=True)
sys.stdin.read()
"""


def test_wait_on_a_stopped_peer_ends_at_the_deadline(engines):
    """MoRI-IO's Wait() can block for ever here; ferry's deadline ends it, failed."""
    child = subprocess.Popen([sys.executable, "-c", _TARGET], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        engine_hex, mem_hex = child.stdout.readline().split()
        a = engines("init", default_deadline_ms=1500)
        src = random_bytes(1 << 20, 5)
        ma = a.register_torch_tensor(src)
        a.register_remote_engine(io.EngineDesc.unpack(bytes.fromhex(engine_hex)))
        s = a.create_session(ma, io.MemoryDesc.unpack(bytes.fromhex(mem_hex)))
        assert s.write(0, 0, 4096, 1).WaitFor(20000) == io.StatusCode.SUCCESS
        os.kill(child.pid, signal.SIGSTOP)
        start = time.monotonic()
        st = s.batch_write([0, 8192], [0, 8192], [4096, 1 << 16], 2)
        st.Wait()
        took = time.monotonic() - start
        assert st.Failed() and st.Code() == io.StatusCode.ERR_RDMA_OP, st
        assert st.Message().startswith(("DEADLINE_EXCEEDED", "UNAVAILABLE")), st.Message()
        assert took < 15, took
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
