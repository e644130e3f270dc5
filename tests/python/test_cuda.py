"""CUDA memory through the Python module: device buffers from the CUDA runtime (through ctypes,
no torch needed) or from torch. Every test skips, with ferry's reason, where ferry reports no
CUDA."""

import ctypes
import ctypes.util
import glob

import numpy as np
import pytest

import ferry
from util import (
    expect_applied,
    fresh_key,
    pop_notifications,
    random_bytes,
    require_cuda,
    scattered_ops,
)

pytestmark = pytest.mark.skipif(
    not ferry.cuda_available(), reason=f"no CUDA here: {ferry.cuda_unavailable_reason()}"
)

_H2D, _D2H = 1, 2


def _load_cudart():
    names = [ctypes.util.find_library("cudart")]
    names += sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so*"), reverse=True)
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class DeviceBuffer:
    """cudaMalloc'd memory on device 0, filled and read back with cudaMemcpy."""

    _rt = None

    def __init__(self, size: int):
        if DeviceBuffer._rt is None:
            DeviceBuffer._rt = _load_cudart() or pytest.skip("libcudart.so not found for ctypes")
        self.rt, self.size, self.ptr = DeviceBuffer._rt, size, ctypes.c_void_p()
        self._check(self.rt.cudaSetDevice(0))
        self._check(self.rt.cudaMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(size)))
        self.fill(np.zeros(size, np.uint8))

    def _check(self, err: int) -> None:
        assert err == 0, f"CUDA runtime error {err}"

    def fill(self, data: np.ndarray) -> None:
        assert data.nbytes == self.size
        self._check(self.rt.cudaMemcpy(self.ptr, ctypes.c_void_p(data.ctypes.data),
                                       ctypes.c_size_t(self.size), _H2D))

    def read(self) -> np.ndarray:
        out = np.empty(self.size, np.uint8)
        self._check(self.rt.cudaMemcpy(ctypes.c_void_p(out.ctypes.data), self.ptr,
                                       ctypes.c_size_t(self.size), _D2H))
        return out

    def free(self) -> None:
        if self.ptr:
            self.rt.cudaFree(self.ptr)
            self.ptr = ctypes.c_void_p()


@pytest.fixture
def engines():
    require_cuda()
    a, b = ferry.Engine(key=fresh_key("ca")), ferry.Engine(key=fresh_key("cb"))
    a.add_peer(b.describe().pack())
    b.add_peer(a.describe().pack())
    buffers = []

    def device_buffer(size):
        buf = DeviceBuffer(size)
        buffers.append(buf)
        return buf

    yield a, b, device_buffer
    a.close()
    b.close()
    for buf in buffers:
        buf.free()


def register_cuda(engine, buf: DeviceBuffer) -> ferry.MemoryDesc:
    desc = engine.register_memory(buf.ptr.value, buf.size, kind="cuda", device=0, owner=buf)
    assert (desc.kind, desc.device, desc.size) == ("cuda", 0, buf.size)
    return desc


def test_system_info_lists_gpus():
    info = ferry.system_info()
    assert info["cuda_built"] and info["cuda_available"]
    assert info["gpus"] and info["gpus"][0]["memory_bytes"] > 0


def test_host_to_device_write_and_read_back(engines):
    a, b, device_buffer = engines
    size = 1 << 20
    host = random_bytes(size, 31)
    dev = device_buffer(size)
    session = a.open_session(a.register_memory(host), register_cuda(b, dev))
    assert session.write(0, 0, size).wait()
    assert np.array_equal(dev.read(), host)
    expected = host.copy()
    host[:] = 0
    assert session.read(100, 200, 5000).wait()
    assert np.array_equal(host[100:5100], expected[200:5200])
    assert not host[:100].any()


def test_device_to_device_batches_keep_every_byte(engines):
    a, b, device_buffer = engines
    size = 8 << 20
    src, dst = device_buffer(size), device_buffer(size)
    data = random_bytes(size, 32)
    src.fill(data)
    session = a.open_session(register_cuda(a, src), register_cuda(b, dst))
    ops = scattered_ops(size, 4096, 2000, 33)
    t = session.write_batch(ops)
    assert t.wait(), t.status()
    expect_applied(data, dst.read(), ops, write=True)

    dst_data = random_bytes(size, 34)
    dst.fill(dst_data)
    rops = scattered_ops(size, 1000, 8000, 35)
    assert session.read_batch(rops).wait()
    expect_applied(dst_data, src.read(), rops, write=False)


def test_device_out_of_range_moves_nothing(engines):
    a, b, device_buffer = engines
    src, dst = device_buffer(4096), device_buffer(4096)
    src.fill(random_bytes(4096, 36))
    session = a.open_session(register_cuda(a, src), register_cuda(b, dst))
    with pytest.raises(ferry.Error) as info:
        session.write_batch([(0, 0, 64), (0, 4000, 100)]).wait()
    assert info.value.code == "OUT_OF_RANGE"
    assert not dst.read().any()


def test_device_notification_follows_its_data(engines):
    a, b, device_buffer = engines
    size = 1 << 20
    src, dst = device_buffer(size), device_buffer(size)
    data = random_bytes(size, 37)
    src.fill(data)
    session = a.open_session(register_cuda(a, src), register_cuda(b, dst))
    ops = scattered_ops(size, 256, 2048, 38)
    assert session.write_batch(ops, notification=b"kv-ready").wait()
    assert pop_notifications(b, 1) == [(a.key, b"kv-ready")]
    expect_applied(data, dst.read(), ops, write=True)


def test_torch_cuda_tensors():
    require_cuda()
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    with ferry.Engine(key=fresh_key("tca")) as a, ferry.Engine(key=fresh_key("tcb")) as b:
        src = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8, device="cuda:0")
        dst = torch.zeros_like(src)
        cpu = torch.zeros(1 << 20, dtype=torch.uint8)
        a_mem, b_mem, c_mem = a.register_tensor(src), b.register_tensor(dst), b.register_tensor(cpu)
        assert (a_mem.kind, a_mem.device) == ("cuda", 0)
        assert c_mem.kind == "host"
        a.add_peer(b.describe().pack())
        to_gpu = a.open_session(a_mem, b_mem)
        to_cpu = a.open_session(a_mem, c_mem)
        assert to_gpu.write(0, 0, 1 << 20).wait()
        assert to_cpu.write_batch(np.array([[0, 0, 1 << 19]], np.uint64)).wait()
        torch.cuda.synchronize()
        assert torch.equal(src, dst)
        assert torch.equal(src[: 1 << 19].cpu(), cpu[: 1 << 19])
