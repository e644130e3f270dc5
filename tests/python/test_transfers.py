"""Reads and writes through sessions, over every usable transport: the behaviours of the C++
conformance suite, driven from Python with numpy buffers checked byte for byte."""

import sys
import threading
import time

import numpy as np
import pytest

import ferry
from util import Pair, expect_applied, pop_notifications, random_bytes, scattered_ops


def failure(transfer: ferry.Transfer) -> ferry.Error:
    with pytest.raises(ferry.Error) as info:
        transfer.wait()
    return info.value


def test_single_write_and_read(make_pair, transport):
    p = make_pair(1 << 16)
    p.a_buf[:] = random_bytes(p.a_buf.size, 1)
    data = p.a_buf.copy()
    t = p.session.write(100, 200, 5000)
    assert t.wait() is True
    assert t.test() and t.succeeded()
    assert t.status() == ("OK", "")
    assert t.bytes == 5000
    assert t.path.transport == transport
    assert np.array_equal(p.b_buf[200:5200], data[100:5100])
    assert p.b_buf[199] == 0 and p.b_buf[5200] == 0

    p.a_buf[:] = 0
    r = p.session.read(7, 200, 5000)
    assert r.wait()
    assert np.array_equal(p.a_buf[7:5007], data[100:5100])
    assert not p.a_buf[:7].any() and not p.a_buf[5007:].any()


@pytest.mark.parametrize("as_array", [True, False], ids=["numpy-ops", "tuple-ops"])
def test_batched_writes_and_reads_keep_every_byte(make_pair, as_array):
    size = 8 << 20
    p = make_pair(size)
    p.a_buf[:] = random_bytes(size, 2)
    ops = scattered_ops(size, 4096, 2000, 3)
    batch = ops if as_array else [tuple(op) for op in ops.tolist()]
    t = p.session.write_batch(batch)
    assert t.wait()
    assert t.bytes == int(ops[:, 2].sum())
    expect_applied(p.a_buf, p.b_buf, ops, write=True)

    p.b_buf[:] = random_bytes(size, 4)
    rops = scattered_ops(size, 1000, 8000, 5)
    t = p.session.read_batch(rops if as_array else rops.tolist())
    assert t.wait(), t.status()
    expect_applied(p.b_buf, p.a_buf, rops, write=False)


def test_large_batches_split_across_threads_stay_exact(make_pair):
    size = 64 << 20
    p = make_pair(size, copy_threads=4, parallel_copy_bytes=1 << 20)
    p.a_buf[:] = random_bytes(size, 6)
    ops = scattered_ops(size, 97, 600000, 7)
    assert p.session.write_batch(ops).wait()
    expect_applied(p.a_buf, p.b_buf, ops, write=True)
    assert p.session.write_batch([(0, 0, size)]).wait()
    assert np.array_equal(p.a_buf, p.b_buf)


@pytest.mark.parametrize(
    "bad",
    [
        (0, 4000, 100),
        (4000, 0, 100),
        (4097, 0, 0),
        (0, 0, 4097),
        (2**64 - 1, 0, 2),
        (0, 2**64 - 2, 8),
        (1, 1, 2**64 - 1),
    ],
)
def test_out_of_range_moves_nothing(make_pair, bad):
    p = make_pair(4096)
    p.a_buf[:] = random_bytes(4096, 8)
    before = p.a_buf.copy()
    # A good op first: the whole batch must fail before any byte moves.
    for ops in ([(0, 0, 64), bad], np.array([(0, 0, 64), bad], np.uint64)):
        assert failure(p.session.write_batch(ops)).code == "OUT_OF_RANGE"
        assert failure(p.session.read_batch(ops)).code == "OUT_OF_RANGE"
    assert not p.b_buf.any()
    assert np.array_equal(p.a_buf, before)


def test_out_of_range_single_ops_and_exact_ends(make_pair):
    p = make_pair(4096)
    p.a_buf[:] = random_bytes(4096, 9)
    t = p.session.write(0, 4095, 2)
    e = failure(t)
    assert e.code == "OUT_OF_RANGE"
    assert "remote offset 4095" in e.message
    assert t.status()[0] == "OUT_OF_RANGE" and not t.succeeded() and t.test()
    assert failure(p.session.read(4095, 0, 2)).code == "OUT_OF_RANGE"
    assert not p.b_buf.any()
    # Exactly the end of both regions is fine; so is an empty op at the end.
    assert p.session.write(4032, 4032, 64).wait()
    assert p.session.write(4096, 4096, 0).wait()
    assert np.array_equal(p.b_buf[4032:], p.a_buf[4032:])


@pytest.mark.parametrize(
    "ops", [[], (), np.zeros((0, 3), np.uint64)], ids=["list", "tuple", "array"]
)
def test_empty_batch_succeeds(make_pair, ops):
    p = make_pair(4096)
    t = p.session.write_batch(ops)
    assert t.test()
    assert t.wait()
    assert t.bytes == 0
    assert p.session.read_batch(ops).wait()


@pytest.mark.parametrize(
    "ops",
    [
        # Integer arrays of any dtype and strides are ops (test_engine.py); these are not.
        np.array([[0, 0, -1], [0, 0, 1]], np.int64),
        np.zeros((2, 3), np.float64),
        np.zeros((2, 4), np.uint64),
        np.zeros(6, np.uint64),
        np.zeros((3, 2), np.bool_),
        np.zeros((2, 3), np.dtype(">u8")),
        [(1, 2)],
        [(1, 2, 3, 4)],
        [(1, 2, -3)],
        [(0, 0, 1.5)],
        [(0, 0, 1), "abc"],
    ],
    ids=["negative", "float", "4-columns", "1-d", "bool", "big-endian", "pair", "quad",
         "negative-tuple", "float-size", "not-a-tuple"],
)
def test_malformed_ops_are_invalid_arguments(make_pair, ops):
    p = make_pair(4096)
    with pytest.raises(ferry.Error) as info:
        p.session.write_batch(ops)
    assert info.value.code == "INVALID_ARGUMENT"


def test_ops_must_be_a_sequence_or_an_array(make_pair):
    p = make_pair(4096)
    for ops in (5, "abc", None):
        with pytest.raises(TypeError):
            p.session.write_batch(ops)


def test_ops_from_lists_and_numpy_rows(make_pair):
    p = make_pair(4096)
    p.a_buf[:] = random_bytes(4096, 10)
    rows = np.array([[0, 100, 10], [50, 200, 10]], np.uint64)
    assert p.session.write_batch(list(rows)).wait()  # rows are sequences of numpy integers
    assert p.session.write_batch([[300, 300, 5]]).wait()
    expect_applied(p.a_buf, p.b_buf, [[0, 100, 10], [50, 200, 10], [300, 300, 5]], write=True)


def test_deregistered_regions_fail_cleanly(make_pair):
    p = make_pair(4096)
    p.b.deregister_memory(p.b_desc)
    assert failure(p.session.write(0, 0, 64)).code == "FAILED_PRECONDITION"
    with pytest.raises(ferry.Error) as info:
        p.a.open_session(p.a_desc, p.b_desc)
    assert info.value.code == "FAILED_PRECONDITION"

    q = make_pair(4096)
    q.a.deregister_memory(q.a_desc)
    assert failure(q.session.read(0, 0, 64)).code == "FAILED_PRECONDITION"
    assert failure(q.session.write_batch([(0, 0, 8)])).code == "FAILED_PRECONDITION"


def test_deadlines_end_slow_transfers(make_pair):
    size = 64 << 20
    # The engine's default deadline (1 ns) passes before 64 MiB can move.
    p = make_pair(size, copy_threads=2, parallel_copy_bytes=1 << 20, default_deadline_ms=1e-6)
    ops = np.array([(off, off, 4096) for off in range(0, size, 4096)], np.uint64)
    t = p.session.write_batch(ops)
    assert failure(t).code == "DEADLINE_EXCEEDED"
    assert t.status()[0] == "DEADLINE_EXCEEDED"
    assert not t.succeeded()
    # A per-call deadline overrides the default.
    assert p.session.write_batch(ops, deadline_ms=60_000).wait()
    # wait(timeout_ms) returns early without ending the transfer.
    u = p.session.write_batch(ops, deadline_ms=60_000)
    early = u.wait(timeout_ms=1e-6)
    assert early in (True, False)
    if not early:
        assert u.status()[0] in ("IN_PROGRESS", "OK")
    assert u.wait()
    assert u.wait(timeout_ms=0)  # a finished transfer answers at once


def test_transfer_ids(make_pair):
    p = make_pair(4096)
    mine = p.a.allocate_transfer_id()
    assert p.session.write(0, 0, 8, transfer_id=mine).id == mine
    assert p.session.write_batch([(0, 0, 8)], transfer_id=12345).id == 12345
    a, b = p.session.write(0, 0, 8), p.session.read(0, 0, 8)
    assert a.id != b.id


def test_notification_follows_its_data(make_pair):
    size = 1 << 20
    p = make_pair(size)
    p.a_buf[:] = random_bytes(size, 11)
    ops = scattered_ops(size, 256, 2048, 12)
    assert p.session.write_batch(ops, notification=b"layer-31-done").wait()
    assert pop_notifications(p.b, 1) == [(p.a.key, b"layer-31-done")]
    expect_applied(p.a_buf, p.b_buf, ops, write=True)
    # Single writes carry notifications too; str is sent as UTF-8.
    assert p.session.write(0, 0, 16, notification="one").wait()
    assert pop_notifications(p.b, 1) == [(p.a.key, b"one")]
    # An empty batch may carry one as well.
    assert p.session.write_batch([], notification=b"empty").wait()
    assert pop_notifications(p.b, 1) == [(p.a.key, b"empty")]
    # A failed batch delivers no notification.
    assert failure(p.session.write_batch([(0, size, 1)], notification=b"never")).code == "OUT_OF_RANGE"
    assert pop_notifications(p.b, 1, timeout_s=0.1) == []


def test_notifications_arrive_in_order(make_pair):
    p = make_pair(1 << 16)
    transfers = [p.session.write(i, i, 1, notification=f"n{i}".encode()) for i in range(100)]
    for t in transfers:
        assert t.wait()
    got = pop_notifications(p.b, 100)
    assert [m for _, m in got] == [f"n{i}".encode() for i in range(100)]


def test_reads_carry_no_notification(make_pair):
    p = make_pair(4096)
    assert failure(p.session.read(0, 0, 8, notification=b"x")).code == "INVALID_ARGUMENT"
    assert failure(p.session.read_batch([(0, 0, 8)], notification=b"x")).code == "INVALID_ARGUMENT"


def test_concurrent_sessions_from_python_threads(transport):
    threads, rounds, size = 6, 20, 1 << 18
    p = Pair.make(transport, threads * size)
    try:
        sessions = [p.a.open_session(p.a_desc, p.b_desc) for _ in range(threads)]
        p.a_buf[:] = random_bytes(p.a_buf.size, 13)
        errors = []

        def worker(i: int) -> None:
            try:
                base = i * size
                rng = np.random.default_rng(100 + i)
                for r in range(rounds):
                    n = int(rng.integers(1, size))
                    ops = np.array([(base, base, n)], np.uint64)
                    t = sessions[i].write_batch(ops) if r % 2 else sessions[i].write(base, base, n)
                    assert t.wait()
                    assert np.array_equal(p.b_buf[base : base + n], p.a_buf[base : base + n])
                    assert sessions[i].read(base, base, n).wait()
            except Exception as e:  # reported below, on the main thread
                errors.append((i, e))

        workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=120)
        assert not any(w.is_alive() for w in workers)
        assert errors == []
        assert np.array_equal(p.a_buf, p.a_buf)  # buffers still readable after the storm
    finally:
        p.close()


def test_wait_releases_the_gil(make_pair):
    size = 32 << 20
    p = make_pair(size, copy_threads=2, parallel_copy_bytes=1 << 20)
    stop = threading.Event()
    ticks = [0]

    def spin():  # runs only when the main thread lets go of the GIL
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)  # no forced switches: only a released GIL lets `spin` run
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        progressed = False
        for _ in range(20):
            t = p.session.write_batch([(0, 0, size)] * 4)
            before = ticks[0]
            t.wait()
            if ticks[0] > before:
                progressed = True
                break
        assert progressed, "no other Python thread ran while wait() blocked"
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(interval)


def test_many_small_transfers_in_flight(make_pair):
    p = make_pair(1 << 20)
    p.a_buf[:] = random_bytes(1 << 20, 14)
    transfers = [p.session.write(i * 1024, i * 1024, 1024) for i in range(1024)]
    assert all(t.wait() for t in transfers)
    assert np.array_equal(p.a_buf, p.b_buf)
    assert len({t.id for t in transfers}) == 1024


def test_transfer_repr_and_session_properties(make_pair, transport):
    p = make_pair(4096)
    t = p.session.write(0, 0, 8)
    t.wait()
    assert "OK" in repr(t) and transport in repr(t)
    assert p.session.local == p.a_desc
    assert p.session.remote == p.b_desc
    assert p.session.path == t.path
    assert isinstance(p.session.path.staged, bool)
    assert transport in str(p.session.path)


@pytest.mark.parametrize("merge", [False, True], ids=["unmerged", "merged"])
def test_ops_changed_by_another_thread_never_move_unchecked_bytes(make_pair, merge):
    # The target is 4 KiB in the middle of b's buffer, between guard bytes; a second thread
    # flips op 0 between in range and 512 KiB past the region while batches are posted. The
    # binding copies the array before the engine checks it, so what moves was checked.
    guard, region, bad = 1 << 20, 4096, 512 << 10
    p = make_pair(2 * guard + region, merge_adjacent_ops=merge)
    a = np.frombuffer(p.a_buf, np.uint8)
    b = np.frombuffer(p.b_buf, np.uint8)
    a[:] = 0x5A
    b[:] = 0xAB
    b[guard : guard + region] = 0xCD
    target = p.b.register_memory(b.ctypes.data + guard, region, owner=p.b_buf)
    session = p.a.open_session(p.a_desc, ferry.MemoryDesc.unpack(target.pack()))
    ops = np.zeros((2048, 3), np.uint64)
    ops[:, 2] = 0 if merge else 1  # empty ops merge away; one-byte ops stay apart
    ops[0] = (0, 0, region)
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            ops[0, 1] = bad
            ops[0, 1] = 0

    flipper = threading.Thread(target=flip)
    flipper.start()
    codes = []
    try:
        for _ in range(50):
            for post in (session.write_batch, session.read_batch):
                t = post(ops)
                try:
                    t.wait()
                    codes.append("OK")
                except ferry.Error as e:
                    codes.append(e.code)
    finally:
        stop.set()
        flipper.join()
    assert set(codes) <= {"OK", "OUT_OF_RANGE"}, set(codes)
    assert (b[:guard] == 0xAB).all() and (b[guard + region :] == 0xAB).all(), "bytes landed outside the region"
    assert np.isin(a[:region], [0x5A, 0xCD]).all(), "bytes read from outside the region"
    p.b.deregister_memory(target)


@pytest.mark.parametrize("deadline_ms", [0, -1, -1e9])
def test_non_positive_deadlines_are_refused_before_any_byte_moves(make_pair, deadline_ms):
    p = make_pair(4096)
    np.frombuffer(p.a_buf, np.uint8)[:] = 7
    for t in (
        p.session.write(0, 0, 4096, deadline_ms=deadline_ms),
        p.session.write_batch([(0, 0, 4096)], deadline_ms=deadline_ms),
        p.session.read(0, 0, 4096, deadline_ms=deadline_ms),
    ):
        assert failure(t).code == "INVALID_ARGUMENT"
    assert not np.frombuffer(p.b_buf, np.uint8).any()
    # A positive deadline under a nanosecond is a deadline, not zero.
    t = p.session.write(0, 0, 64, deadline_ms=1e-9)
    try:
        t.wait()
    except ferry.Error as e:
        assert e.code == "DEADLINE_EXCEEDED"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e300])
def test_non_finite_times_are_invalid_arguments(make_pair, bad):
    p = make_pair(4096)
    t = p.session.write(0, 0, 64)
    for call in (
        lambda: t.wait(timeout_ms=bad),
        lambda: p.session.write(0, 0, 64, deadline_ms=bad),
        lambda: p.session.write_batch([(0, 0, 64)], deadline_ms=bad),
        lambda: p.session.read_batch([(0, 0, 64)], deadline_ms=bad),
    ):
        with pytest.raises(ferry.Error) as info:
            call()
        assert info.value.code == "INVALID_ARGUMENT"
    assert t.wait()
