"""ferry.alloc_shared: shareable host memory and the shm transport from Python."""

import gc

import numpy as np
import pytest

import ferry
from util import fresh_key, random_bytes

pytestmark = pytest.mark.skipif(
    "shm" not in ferry.system_info()["transports_usable"], reason="no shm transport in this build"
)


def test_alloc_shared_is_a_zeroed_writable_uint8_array():
    buf = ferry.alloc_shared(10_000)
    assert buf.dtype == np.uint8 and buf.shape == (10_000,) and buf.flags.writeable
    assert not buf.any()
    buf[:] = 7
    view = buf[100:200]
    del buf
    gc.collect()
    assert (view == 7).all(), "a view keeps the buffer alive"


@pytest.mark.parametrize("nbytes", [0, -1])
def test_alloc_shared_rejects_empty(nbytes):
    with pytest.raises(ferry.Error) as e:
        ferry.alloc_shared(nbytes)
    assert e.value.code == "INVALID_ARGUMENT"


def test_shm_carries_shared_buffers_and_refuses_heap_ones():
    with ferry.Engine(key=fresh_key("sa"), transports=["shm"]) as a, ferry.Engine(
        key=fresh_key("sb"), transports=["shm"]
    ) as b:
        with pytest.raises(ferry.Error) as e:
            b.register_memory(np.zeros(4096, np.uint8))
        assert e.value.code == "UNAVAILABLE"
        src, dst = ferry.alloc_shared(1 << 20), ferry.alloc_shared(1 << 20)
        src[:] = random_bytes(1 << 20, 5)
        a_desc, b_desc = a.register_memory(src), b.register_memory(dst[4096:])  # a range inside
        a.add_peer(b.describe().pack())
        session = a.open_session(a_desc, ferry.MemoryDesc.unpack(b_desc.pack()))
        assert session.path.transport == "shm"
        session.write(0, 0, 8192, notification=b"done").wait()
        assert np.array_equal(dst[4096 : 4096 + 8192], src[:8192])
        assert b.pop_notifications() == [(a.key, b"done")]
