"""register_memory(..., allowed_peers=[...]): a region for named peers only. The allowed peer
reads and writes it; any other is refused with PERMISSION_DENIED before a byte moves, counted
in the target's metrics(), and the target keeps serving."""

import numpy as np
import pytest

import ferry
from util import TRANSPORTS, fresh_key

SIZE = 4096
SECRET = "python-access-secret-0123456789"


def region(engine: ferry.Engine, allowed=None):
    """(buffer, desc): a zeroed buffer of its own (shareable, so that shm carries it too)."""
    buf = ferry.alloc_shared(SIZE)
    if allowed is None:
        return buf, engine.register_memory(buf)
    return buf, engine.register_memory(buf, allowed_peers=allowed)


@pytest.mark.parametrize("secret", ["", SECRET], ids=["nosecret", "secret"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_only_allowed_peers_reach_the_region(transport, secret):
    keys = [fresh_key(p) for p in ("target", "ok", "no")]
    engines = [ferry.Engine(key=k, transports=[transport], secret=secret) for k in keys]
    target, ok, no = engines
    try:
        closed_buf, closed = region(target, allowed=[keys[1]])
        open_buf, opened = region(target)
        ok_buf, ok_desc = region(ok)
        no_buf, no_desc = region(no)
        for e in (ok, no):
            e.add_peer(target.describe().pack())

        ok_buf[:] = 0x5A
        s = ok.open_session(ok_desc, ferry.MemoryDesc.unpack(closed.pack()))
        assert s.write(0, 0, SIZE).wait()
        assert (np.frombuffer(closed_buf, np.uint8) == 0x5A).all()

        no_buf[:] = 0xEE
        with pytest.raises(ferry.Error) as info:
            no.open_session(no_desc, ferry.MemoryDesc.unpack(closed.pack()))
        assert info.value.code == "PERMISSION_DENIED"
        assert f"region {closed.region}" in info.value.message
        assert (np.frombuffer(closed_buf, np.uint8) == 0x5A).all()
        assert target.metrics()["access_denied"] == 1
        assert "ferry_access_denied_total" in target.metrics(format="prometheus")

        # The refused peer still reaches the target's open region; the allowed one, its own.
        t = no.open_session(no_desc, ferry.MemoryDesc.unpack(opened.pack()))
        assert t.write(0, 0, SIZE).wait()
        assert (np.frombuffer(open_buf, np.uint8) == 0xEE).all()
        ok_buf[:] = 0x21
        assert s.write(0, 0, SIZE).wait()
        assert (np.frombuffer(closed_buf, np.uint8) == 0x21).all()
        assert target.metrics()["access_denied"] == 1
    finally:
        for e in engines:
            e.close()


def test_allowed_peers_keyword_on_the_pointer_form_and_bad_keys():
    with ferry.Engine(key=fresh_key("kw"), transports=["local"]) as e:
        buf = np.zeros(SIZE, np.uint8)
        d = e.register_memory(buf.ctypes.data, SIZE, kind="host", owner=buf, allowed_peers=["x"])
        assert d.size == SIZE
        with pytest.raises(ferry.Error) as info:
            e.register_memory(np.zeros(16, np.uint8), allowed_peers=[""])
        assert info.value.code == "INVALID_ARGUMENT"
        assert e.register_memory(np.zeros(16, np.uint8), allowed_peers=[]).size == 16
