"""Torch tensors between two processes through cuda_ipc, with the caching allocator's expandable
segments on (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): such memory is mapped with cuMem
and has no CUDA IPC handle, so it travels as its allocations' descriptors. Skips without torch or
a GPU."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ferry

_OWNER = textwrap.dedent(
    """
    import os, sys, time
    import torch, ferry
    base, n = sys.argv[1], int(sys.argv[2])
    e = ferry.Engine(key="torch-ipc-owner-%d" % os.getpid(), transports=["cuda_ipc", "ucx"])
    t = torch.zeros(n, dtype=torch.uint8, device="cuda")
    d = e.register_tensor(t)
    open(base + ".m.tmp", "wb").write(d.pack())
    open(base + ".e", "wb").write(e.describe().pack())
    os.rename(base + ".m.tmp", base + ".m")
    while not os.path.exists(base + ".done"):
        time.sleep(0.01)
    t.cpu().numpy().tofile(base + ".out")
    """
)


def test_torch_tensors_in_expandable_segments_go_direct_through_cuda_ipc(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available() or not ferry.system_info()["cuda_available"]:
        pytest.skip("needs a usable GPU")
    n = 32 << 20
    base = str(tmp_path / "x")
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, base, str(n)], env=env)
    try:
        for _ in range(3000):
            if os.path.exists(base + ".m") or owner.poll() is not None:
                break
            time.sleep(0.01)
        assert os.path.exists(base + ".m"), "the owner process did not register its tensor"
        e = ferry.Engine(key="torch-ipc-writer", transports=["cuda_ipc", "ucx"])
        src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
        local = e.register_tensor(src)
        e.add_peer(open(base + ".e", "rb").read())
        s = e.open_session(local, ferry.MemoryDesc.unpack(open(base + ".m", "rb").read()))
        assert s.path.transport == "cuda_ipc" and not s.path.staged, s.path
        blocks = n // 65536
        ops = np.array([[i * 65536, (blocks - 1 - i) * 65536, 65536] for i in range(blocks)], dtype=np.uint64)
        s.write_batch(ops).wait()
        open(base + ".done", "w").write("1")
        assert owner.wait(timeout=60) == 0
        got = np.fromfile(base + ".out", dtype=np.uint8).reshape(blocks, 65536)
        want = src.cpu().numpy().reshape(blocks, 65536)[::-1]
        assert np.array_equal(got, want)
    finally:
        if owner.poll() is None:
            owner.kill()
