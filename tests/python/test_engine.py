"""Engine: registration and the buffers it holds, peers, notifications, shutdown (options:
test_engine_options.py)."""

import gc
import time
import weakref

import numpy as np
import pytest

import ferry
from util import NOTIFYING, fresh_key, pop_notifications, register_host


def error_code(fn, *args, **kwargs) -> str:
    with pytest.raises(ferry.Error) as info:
        fn(*args, **kwargs)
    return info.value.code


# ---- module -------------------------------------------------------------------------------


def test_module_surface():
    assert ferry.__version__ == ferry.version()
    assert ferry.version().count(".") == 2
    info = ferry.system_info()
    assert info["version"] == ferry.version()
    assert "local" in info["transports_compiled"]
    assert set(info["transports_usable"]) <= set(info["transports_compiled"])
    assert info["cuda_available"] == ferry.cuda_available()
    assert bool(info["cuda_unavailable_reason"]) != ferry.cuda_available()
    assert ferry.cuda_unavailable_reason() == info["cuda_unavailable_reason"]
    if not info["cuda_built"]:
        assert not info["cuda_available"]
    for gpu in info["gpus"]:
        assert {"ordinal", "name", "memory_bytes", "sm"} <= set(gpu)
    assert ferry.CODES[0] == "OK" and "OUT_OF_RANGE" in ferry.CODES
    assert ferry.Engine.__module__ == "ferry"
    for name in ferry.__all__:
        assert getattr(ferry, name).__doc__, name


def test_error_is_a_plain_exception_with_a_code():
    e = ferry.Error("NOT_FOUND", "region 9 is not registered")
    assert isinstance(e, Exception)
    assert (e.code, e.message) == ("NOT_FOUND", "region 9 is not registered")
    assert str(e) == "NOT_FOUND: region 9 is not registered"
    assert ferry.Error().code == "UNKNOWN"
    import pickle

    back = pickle.loads(pickle.dumps(e))
    assert (back.code, back.message) == (e.code, e.message)


# ---- registration -------------------------------------------------------------------------


def test_register_buffers_of_several_kinds(engine):
    for buf in (np.zeros(1000, np.uint8), np.zeros((10, 10), np.float32), bytearray(64)):
        desc = engine.register_memory(buf)
        assert desc.size == memoryview(buf).nbytes
        assert desc.kind == "host"
    arr = np.zeros(64, np.uint8)
    assert engine.register_memory(arr).address == arr.ctypes.data


def read_only_array():
    a = np.zeros(16, np.uint8)
    a.setflags(write=False)
    return a


@pytest.mark.parametrize(
    "make",
    [
        lambda: b"read-only bytes",
        read_only_array,
        lambda: np.zeros((8, 8), np.uint8)[:, ::2],
        lambda: np.zeros((8, 8), np.uint8).T,
        lambda: np.zeros(0, np.uint8),
    ],
    ids=["bytes", "read-only", "strided", "fortran", "empty"],
)
def test_unusable_buffers_are_invalid_arguments(engine, make):
    assert error_code(engine.register_memory, make()) == "INVALID_ARGUMENT"
    assert engine._held_buffers() == 0


def test_register_needs_a_buffer(engine):
    with pytest.raises(TypeError):
        engine.register_memory([1, 2, 3])
    with pytest.raises(TypeError):
        engine.register_memory(12345)


def test_register_pointer(engine):
    buf = np.zeros(4096, np.uint8)
    desc = engine.register_memory(buf.ctypes.data, buf.nbytes)
    assert (desc.address, desc.size, desc.kind) == (buf.ctypes.data, 4096, "host")
    assert engine._held_buffers() == 0, "no owner given, none held"
    engine.deregister_memory(desc)
    assert error_code(engine.register_memory, 0, 64) == "INVALID_ARGUMENT"
    assert error_code(engine.register_memory, buf.ctypes.data, 64, kind="gpu") == "INVALID_ARGUMENT"


def test_cuda_pointer_without_cuda_fails_cleanly(engine):
    if ferry.cuda_available():
        pytest.skip("CUDA is available here")
    assert error_code(engine.register_memory, 1 << 20, 4096, kind="cuda", device=0) in (
        "FAILED_PRECONDITION",
        "UNAVAILABLE",
    )


def test_registered_buffers_stay_alive_until_deregistered(engine):
    buf = np.zeros(4096, np.uint8)
    ref = weakref.ref(buf)
    desc = engine.register_memory(buf)
    del buf
    gc.collect()
    assert ref() is not None, "the engine holds the buffer while it is registered"
    engine.deregister_memory(desc)
    gc.collect()
    assert ref() is None, "deregistration releases it"


def test_owner_stays_alive_until_deregistered(engine):
    buf = np.zeros(4096, np.uint8)
    ref = weakref.ref(buf)
    desc = engine.register_memory(buf.ctypes.data, buf.nbytes, owner=buf)
    del buf
    gc.collect()
    assert ref() is not None
    engine.deregister_memory(desc.region)  # by region id
    gc.collect()
    assert ref() is None


def test_registered_bytearray_cannot_be_resized(engine):
    buf = bytearray(100)
    desc = engine.register_memory(buf)
    with pytest.raises(BufferError):
        buf.extend(b"x" * 100)
    engine.deregister_memory(desc)
    buf.extend(b"x" * 100)


def test_close_releases_buffers():
    e = ferry.Engine(key=fresh_key("close"))
    buf = np.zeros(4096, np.uint8)
    ref = weakref.ref(buf)
    e.register_memory(buf)
    del buf
    e.close()
    gc.collect()
    assert ref() is None
    e.close()  # closing twice is fine


def test_deregister_twice_is_not_found(engine):
    desc = engine.register_memory(np.zeros(64, np.uint8))
    engine.deregister_memory(desc)
    assert error_code(engine.deregister_memory, desc) == "NOT_FOUND"
    assert error_code(engine.deregister_memory, 987654) == "NOT_FOUND"


# ---- peers, sessions, notifications -------------------------------------------------------


def test_peers_from_descriptors_or_bytes(engine):
    with ferry.Engine(key=fresh_key("peer")) as other:
        mine = engine.register_memory(np.zeros(64, np.uint8))
        theirs = other.register_memory(np.zeros(64, np.uint8))
        assert error_code(engine.open_session, mine, theirs) == "FAILED_PRECONDITION"
        engine.add_peer(other.describe().pack())
        engine.add_peer(other.describe())  # replacing a known peer is fine
        session = engine.open_session(mine, theirs)
        assert session.local == mine and session.remote == theirs
        assert session.path.transport in engine.transports
        engine.remove_peer(other.key)
        assert error_code(engine.remove_peer, other.key) == "NOT_FOUND"
        assert error_code(engine.open_session, mine, theirs) == "FAILED_PRECONDITION"
        assert error_code(engine.add_peer, b"not a descriptor") == "INVALID_ARGUMENT"


def test_local_side_must_belong_to_the_engine(engine):
    with ferry.Engine(key=fresh_key("other")) as other:
        theirs = other.register_memory(np.zeros(64, np.uint8))
        engine.add_peer(other.describe())
        assert error_code(engine.open_session, theirs, theirs) == "INVALID_ARGUMENT"


def test_session_to_itself(engine):
    buf = np.arange(256, dtype=np.uint8)
    desc = engine.register_memory(buf)
    session = engine.open_session(desc, desc)
    assert session.write(0, 128, 64).wait()
    assert np.array_equal(buf[128:192], np.arange(64, dtype=np.uint8))


def test_transfer_ids_increase(engine):
    ids = [engine.allocate_transfer_id() for _ in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5


@pytest.mark.parametrize("transport", NOTIFYING)
def test_notify_and_pop(transport):
    with ferry.Engine(key=fresh_key("n"), transports=[transport]) as a, ferry.Engine(
        key=fresh_key("m"), transports=[transport]
    ) as b:
        assert error_code(a.notify, b.key, b"hello") == "FAILED_PRECONDITION"
        a.add_peer(b.describe())
        messages = [b"first", b"\x00binary\xff", "text sent as utf-8", b""]
        for m in messages:
            a.notify(b.key, m)
        got = pop_notifications(b, len(messages))
        assert got == [(a.key, m.encode() if isinstance(m, str) else m) for m in messages]
        assert b.pop_notifications() == []
        a.notify(a.key, b"to myself")
        assert pop_notifications(a, 1) == [(a.key, b"to myself")]
        too_big = b"x" * 100_000
        assert error_code(a.notify, b.key, too_big) == "INVALID_ARGUMENT"


@pytest.mark.parametrize("transport", NOTIFYING)
def test_full_backlog_drops_and_counts(transport):
    with ferry.Engine(key=fresh_key("full"), transports=[transport], max_pending_notifications=2) as b, \
            ferry.Engine(key=fresh_key("sender"), transports=[transport]) as a:
        a.add_peer(b.describe())
        refused_at_sender = 0
        for i in range(5):
            try:
                a.notify(b.key, b"n%d" % i)
            except ferry.Error as e:  # a receiver in this process reports the full backlog
                assert e.code == "RESOURCE_EXHAUSTED"
                refused_at_sender += 1
        deadline = time.monotonic() + 10
        while b.stats()["dropped_notifications"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b.stats()["dropped_notifications"] == 3
        assert refused_at_sender in (0, 3)
        assert b.pop_notifications() == [(a.key, b"n0"), (a.key, b"n1")]
        assert a.stats()["dropped_notifications"] == 0


def test_max_notification_bytes_option():
    with ferry.Engine(key=fresh_key("small"), max_notification_bytes=8) as e:
        e.notify(e.key, b"12345678")
        assert error_code(e.notify, e.key, b"123456789") == "INVALID_ARGUMENT"


def test_closed_engine_raises_aborted():
    e = ferry.Engine(key=fresh_key("closed"))
    buf = np.zeros(64, np.uint8)
    desc = e.register_memory(buf)
    session = e.open_session(desc, desc)
    e.close()
    assert "closed" in repr(e)
    for call in (
        lambda: e.key,
        lambda: e.describe(),
        lambda: e.register_memory(np.zeros(8, np.uint8)),
        lambda: e.notify("x", b"y"),
        lambda: e.pop_notifications(),
    ):
        assert error_code(call) == "ABORTED"
    # Sessions outlive their engine and fail cleanly.
    assert error_code(session.write(0, 0, 8).wait) == "ABORTED"


def test_stats_start_at_zero_and_count_nothing_for_good_traffic(transport):
    with ferry.Engine(key=fresh_key("s"), transports=[transport]) as e:
        assert e.stats() == {"rejected_messages": 0, "auth_failures": 0, "access_denied": 0, "connections_refused": 0,
                             "dropped_notifications": 0, "merged_ops": 0,
                             "gpu_kernel_launches": 0, "gpu_kernel_pieces": 0, "gpu_dma_calls": 0,
                             "gpu_dma_copies": 0}
        buf, d = register_host(e, 4096)
        e.open_session(d, d).write(0, 2048, 1024).wait()
        assert e.stats()["rejected_messages"] == 0


def test_engines_that_share_a_secret_connect_and_others_are_refused():
    secret = "python-deployment-secret-01"
    with ferry.Engine(key=fresh_key("sa"), transports=["ucx"], secret=secret) as a, \
            ferry.Engine(key=fresh_key("sb"), transports=["ucx"], secret=secret) as b, \
            ferry.Engine(key=fresh_key("sc"), transports=["ucx"]) as c:
        abuf, ad = register_host(a, 4096)
        bbuf, bd = register_host(b, 4096)
        cbuf, cd = register_host(c, 4096)
        a.add_peer(b.describe().pack())
        assert a.open_session(ad, ferry.MemoryDesc.unpack(bd.pack())).write(0, 0, 4096).wait()
        c.add_peer(b.describe().pack())
        with pytest.raises(ferry.Error) as refused:
            c.open_session(cd, ferry.MemoryDesc.unpack(bd.pack())).write(0, 0, 4096).wait()
        assert refused.value.code == "PERMISSION_DENIED"
        assert b.stats()["auth_failures"] == 1
        assert "ferry_auth_failures_total" in b.metrics(format="prometheus")
    assert error_code(ferry.Engine, transports=["ucx"], secret="short") == "INVALID_ARGUMENT"


# ---- where the ucx transport listens ------------------------------------------------------


def test_ucx_listens_on_loopback_unless_asked():
    with ferry.Engine(key=fresh_key("listen"), transports=["ucx"]) as e:
        addresses = e.describe().addresses
        assert addresses and all(a.startswith("127.0.0.1:") for a in addresses), addresses
    with ferry.Engine(key=fresh_key("listen"), transports=["ucx"], listen_host="0.0.0.0") as e:
        addresses = e.describe().addresses
        assert addresses[0].startswith("127.0.0.1:")
        assert len({a.rsplit(":", 1)[1] for a in addresses}) == 1  # one port on every interface
    assert error_code(ferry.Engine, transports=["ucx"], listen_host="not-an-ip") == "INVALID_ARGUMENT"


# ---- ops arrays, completion callbacks, waits on many, topics, after= ----------------------


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint32, np.int16, np.uint8])
def test_ops_arrays_of_any_integer_dtype(make_pair, dtype):
    pair = make_pair(4096)
    pair.a_buf[:] = np.arange(4096, dtype=np.uint8)
    ops = np.array([[0, 100, 10], [20, 0, 5]], dtype=dtype)
    assert pair.session.write_batch(ops).wait()
    assert np.array_equal(pair.b_buf[100:110], pair.a_buf[0:10])
    assert np.array_equal(pair.b_buf[0:5], pair.a_buf[20:25])
    strided = np.zeros((2, 6), dtype=np.int64)[:, ::2]
    strided[:] = [[1, 200, 3], [4, 300, 2]]
    assert pair.session.write_batch(strided).wait()
    assert np.array_equal(pair.b_buf[200:203], pair.a_buf[1:4])


def test_negative_or_misshapen_ops_are_refused(engine):
    a_buf, a = register_host(engine, 4096)
    session = engine.open_session(a, a)
    assert error_code(session.write_batch, np.array([[0, -1, 4]])) == "INVALID_ARGUMENT"
    assert error_code(session.write_batch, np.array([[0, 1, 4, 5]])) == "INVALID_ARGUMENT"
    assert error_code(session.write_batch, np.array([[0.0, 1.0, 4.0]])) == "INVALID_ARGUMENT"


def _callback():
    import threading

    calls = []
    done = threading.Event()

    def fn(code, message):
        calls.append((code, message, threading.get_ident()))
        done.set()

    return fn, calls, done


def test_on_complete_runs_once_with_the_gil(make_pair):
    import threading

    pair = make_pair(4096)
    fn, calls, done = _callback()
    t = pair.session.write(0, 0, 4096, on_complete=fn)
    assert done.wait(10)
    assert t.wait()
    time.sleep(0.05)
    assert [c[:2] for c in calls] == [("OK", "")]
    fn2, calls2, _ = _callback()
    pair.session.write(0, 4000, 200, on_complete=fn2)  # refused at once, on this thread
    assert calls2[0][0] == "OUT_OF_RANGE" and calls2[0][2] == threading.get_ident()
    with pytest.raises(TypeError):
        pair.session.write(0, 0, 1, on_complete=5)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_on_complete_exceptions_do_not_escape(engine):
    buf, d = register_host(engine, 4096)
    session = engine.open_session(d, d)

    def bad(code, message):
        raise RuntimeError("boom")

    assert session.write(0, 2048, 1024, on_complete=bad).wait()
    assert session.write(0, 2048, 1024).wait()


def test_wait_all_and_wait_any(make_pair):
    pair = make_pair(1 << 16)
    ts = [pair.session.write(i * 4096, i * 4096, 4096) for i in range(8)]
    assert ferry.wait_all(ts)
    assert ferry.wait_any(ts) == 0
    assert ferry.wait_all([])
    assert error_code(ferry.wait_any, []) == "INVALID_ARGUMENT"
    bad = pair.session.write(0, 1 << 16, 1)
    assert error_code(ferry.wait_all, [ts[0], bad]) == "OUT_OF_RANGE"


@pytest.mark.parametrize("transport", NOTIFYING)
def test_topics_keep_subsystems_apart(transport):
    pair = ferry_pair(transport)
    try:
        a, b = pair.a, pair.b
        a.notify(b.key, b"app")
        a.notify(b.key, b"kv", topic="ferry.kv")
        biggest = b"m" * (64 << 10)
        a.notify(b.key, biggest, topic="t" * 64)
        assert error_code(a.notify, b.key, b"m", topic="t" * 65) == "INVALID_ARGUMENT"
        assert pop_until(b, 1, topic="ferry.kv") == [(a.key, b"kv")]
        assert pop_until(b, 1, topic="t" * 64) == [(a.key, biggest)]
        assert pop_until(b, 1) == [(a.key, b"app")]
        assert pair.session.write(0, 0, 64, notification=b"w", notification_topic="ferry.kv").wait()
        assert pop_until(b, 1, topic="ferry.kv") == [(a.key, b"w")]
        assert b.pop_notifications() == []
    finally:
        pair.close()


def test_after_orders_a_notification_after_other_sessions():
    pair = ferry_pair("local")
    try:
        a, b = pair.a, pair.b
        other_src, other_local = register_host(a, 4096)
        other_dst, other_remote = register_host(b, 4096)
        second = a.open_session(other_local, other_remote)
        other_src[:] = 7
        l0 = pair.session.write(0, 0, 4096)
        l1 = second.write(0, 0, 4096)
        fn, calls, done = _callback()
        note = a.notify_after(b.key, b"request done", [l0, l1], topic="ferry.kv", on_complete=fn)
        assert note.wait() and done.wait(10)
        assert pop_until(b, 1, topic="ferry.kv") == [(a.key, b"request done")]
        assert (other_dst == 7).all()
        last = pair.session.write(0, 0, 64, notification=b"n", after=[l0, l1])
        assert last.wait()
        bad = pair.session.write(0, 1 << 30, 1)
        failed = a.notify_after(b.key, b"never", [bad])
        assert error_code(failed.wait) == "OUT_OF_RANGE"
        assert pop_until(b, 1, wait_s=0.1) == [(a.key, b"n")]
    finally:
        pair.close()


def ferry_pair(transport):
    from util import Pair

    return Pair.make(transport, 1 << 16)


def pop_until(engine, n, topic="", wait_s=5.0):
    got, end = [], time.monotonic() + wait_s
    while len(got) < n and time.monotonic() < end:
        got += engine.pop_notifications(topic=topic)
        if len(got) < n:
            time.sleep(0.001)
    return got
