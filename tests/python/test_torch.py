"""Engine.register_tensor: torch tensors by data_ptr / numel * element_size / device.

torch is optional: the duck-typed tests run everywhere, the real-torch tests skip without it.
"""

import gc
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

import ferry
from util import fresh_key, random_bytes


class FakeTensor:
    """Just what register_tensor reads from a torch.Tensor, over a numpy array."""

    def __init__(self, array: np.ndarray, device: str = "cpu", index: int = -1):
        self.array = array
        self.device = SimpleNamespace(type=device, index=None if index < 0 else index)
        self._index = index

    def is_contiguous(self) -> bool:
        return self.array.flags.c_contiguous

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    def numel(self) -> int:
        return self.array.size

    def element_size(self) -> int:
        return self.array.itemsize

    def get_device(self) -> int:
        return self._index


def test_register_tensor_reads_pointer_size_and_device(engine):
    t = FakeTensor(np.zeros((4, 16), np.float32))
    ref = weakref.ref(t)
    desc = engine.register_tensor(t)
    assert (desc.address, desc.size, desc.kind, desc.device) == (t.data_ptr(), 256, "host", -1)
    del t
    gc.collect()
    assert ref() is not None, "the tensor is kept alive while registered"
    engine.deregister_memory(desc)
    gc.collect()
    assert ref() is None


def test_register_tensor_refuses_non_contiguous_and_other_devices(engine):
    with pytest.raises(ferry.Error) as info:
        engine.register_tensor(FakeTensor(np.zeros((4, 4), np.float32).T))
    assert info.value.code == "INVALID_ARGUMENT"
    with pytest.raises(ferry.Error) as info:
        engine.register_tensor(FakeTensor(np.zeros(4, np.float32), device="mps", index=0))
    assert info.value.code == "INVALID_ARGUMENT"


def test_cuda_tensor_goes_to_cuda_registration(engine):
    if ferry.cuda_available():
        pytest.skip("CUDA is available: a fake CUDA tensor would point at host memory")
    with pytest.raises(ferry.Error) as info:
        engine.register_tensor(FakeTensor(np.zeros(64, np.uint8), device="cuda", index=0))
    assert info.value.code in ("FAILED_PRECONDITION", "UNAVAILABLE")


def test_cpu_tensors_between_engines():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    with ferry.Engine(key=fresh_key("ta")) as a, ferry.Engine(key=fresh_key("tb")) as b:
        src = torch.from_numpy(random_bytes(1 << 16, 21).view(np.int32).copy())
        dst = torch.zeros_like(src)
        a_mem, b_mem = a.register_tensor(src), b.register_tensor(dst)
        assert a_mem.size == src.numel() * src.element_size()
        a.add_peer(b.describe().pack())
        session = a.open_session(a_mem, ferry.MemoryDesc.unpack(b_mem.pack()))
        assert session.write(0, 0, a_mem.size).wait()
        assert torch.equal(src, dst)
        dst.zero_()
        assert session.write_batch([(0, 0, 1024), (4096, 8192, 1024)]).wait()
        assert torch.equal(dst[:256], src[:256])
        assert torch.equal(dst[2048:2304], src[1024:1280])
