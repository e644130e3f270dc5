"""tests/python/zmq_standin: the pure-Python zmq stand-in the PLE tests use where pyzmq is not
installed (the GPU machine). Loaded from its file, so it is tested even where pyzmq exists."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN_DIR = os.path.join(HERE, "zmq_standin")


def _load():
    spec = importlib.util.spec_from_file_location(
        "zmq_standin_under_test", os.path.join(STANDIN_DIR, "zmq", "__init__.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


zmq = _load()


@pytest.fixture
def addr():
    path = os.path.join(tempfile.gettempdir(), f"ferry-zmq-{uuid.uuid4().hex[:12]}.ipc")
    yield "ipc://" + path
    assert not os.path.exists(path), "the PULL's close left its socket file"


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.term()


def pull(ctx, addr, opts=None):
    s = ctx.socket(zmq.PULL)
    for k, v in (opts or {}).items():
        s.setsockopt(k, v)
    s.bind(addr)
    return s


def push(ctx, addr):
    s = ctx.socket(zmq.PUSH)
    s.connect(addr)
    return s


def test_round_trip_and_multipart(ctx, addr):
    p = pull(ctx, addr)
    q = push(ctx, addr)
    q.send(b"one")
    q.send_multipart([b"a", b"", bytearray(b"c" * 100000)])
    q.send(b"x", zmq.SNDMORE)
    q.send(memoryview(b"y"))
    assert p.poll(5000) == zmq.POLLIN
    assert p.recv() == b"one" and p.getsockopt(zmq.RCVMORE) == 0
    assert p.recv_multipart() == [b"a", b"", b"c" * 100000]
    assert p.recv() == b"x" and p.getsockopt(zmq.RCVMORE) == 1
    assert p.recv() == b"y" and p.getsockopt(zmq.RCVMORE) == 0
    with pytest.raises(TypeError):
        q.send("a str")
    q.close(linger=0)
    p.close()


def test_noblock_raises_again_and_timeouts_hold(ctx, addr):
    p = pull(ctx, addr)
    with pytest.raises(zmq.Again):
        p.recv(zmq.NOBLOCK)
    assert issubclass(zmq.Again, zmq.ZMQError)
    t0 = time.monotonic()
    assert p.poll(100) == 0
    assert 0.08 < time.monotonic() - t0 < 2
    p.setsockopt(zmq.RCVTIMEO, 100)
    with pytest.raises(zmq.Again):
        p.recv_multipart()
    p.close()


def test_connect_before_bind_keeps_what_was_sent(ctx, addr):
    q = push(ctx, addr)
    q.setsockopt(zmq.LINGER, 0)
    q.send(b"early")  # nobody is bound yet: queued, delivered once the PULL binds
    time.sleep(0.1)
    p = pull(ctx, addr)
    assert p.poll(5000) and p.recv_multipart(zmq.NOBLOCK) == [b"early"]
    q.close()
    p.close()


def test_one_pull_several_pushers_in_order_per_peer(ctx, addr):
    p = pull(ctx, addr)
    n = 200
    pushers = [push(ctx, addr) for _ in range(3)]

    def run(i):
        for k in range(n):
            pushers[i].send_multipart([b"%d" % i, b"%d" % k])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    got = {0: [], 1: [], 2: []}
    deadline = time.monotonic() + 20
    while sum(map(len, got.values())) < 3 * n and time.monotonic() < deadline:
        if p.poll(100):
            i, k = p.recv_multipart()
            got[int(i)].append(int(k))
    for t in threads:
        t.join(5)
    assert all(got[i] == list(range(n)) for i in got), {i: len(v) for i, v in got.items()}
    for q in pushers:
        q.close()
    p.close()


def test_maxmsgsize_drops_the_peer_not_the_socket(ctx, addr):
    p = pull(ctx, addr, opts={zmq.MAXMSGSIZE: 1000})
    big, small = push(ctx, addr), push(ctx, addr)
    big.send(b"x" * 2000)
    time.sleep(0.2)
    assert p.poll(200) == 0  # the oversized message is never delivered
    small.send(b"fine")
    assert p.poll(5000) and p.recv() == b"fine"
    big.close(0)
    small.close(0)
    p.close()


def test_linger_and_term_deliver_before_returning(addr):
    ctx = zmq.Context()
    p = pull(ctx, addr)
    q = push(ctx, addr)
    for k in range(50):
        q.send(b"%d" % k)
    q.close()  # LINGER -1: term() waits until all 50 went out
    ctx2 = zmq.Context.instance()
    assert ctx2 is zmq.Context.instance()
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 50 and time.monotonic() < deadline:
        if p.poll(100):
            got.append(int(p.recv()))
    assert got == list(range(50))
    p.close()
    ctx.term()
    with pytest.raises(zmq.ContextTerminated):
        ctx.socket(zmq.PUSH)


def test_unsupported_things_are_refused(ctx):
    with pytest.raises(zmq.ZMQError, match="PUSH and PULL"):
        ctx.socket(zmq.DEALER)
    s = ctx.socket(zmq.PUSH)
    with pytest.raises(zmq.ZMQError, match="ipc:// and inproc://"):
        s.connect("tcp://127.0.0.1:5555")
    with pytest.raises(zmq.ZMQError, match="binds PULL"):
        s.bind("ipc:///tmp/x")
    s.connect("inproc://nobody")  # accepted, as zmq does; nothing is ever delivered
    s.close(0)


def test_inproc_and_two_processes(ctx, addr):
    p = pull(ctx, "inproc://ple")
    q = push(ctx, "inproc://ple")
    q.send(b"in")
    assert p.poll(5000) and p.recv() == b"in"
    q.close(0)
    p.close()
    # Across processes, as the bridge and vLLM's connector: the child imports it as `zmq`.
    p = pull(ctx, addr)
    code = ("import zmq, sys; assert zmq.STANDIN; c = zmq.Context(); s = c.socket(zmq.PUSH); "
            "s.connect(sys.argv[1]); s.send_multipart([b'from', b'child']); s.close(); c.term()")
    env = dict(os.environ, PYTHONPATH=STANDIN_DIR)
    r = subprocess.run([sys.executable, "-c", code, addr], env=env, timeout=30,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert p.poll(5000) and p.recv_multipart() == [b"from", b"child"]
    p.close()
