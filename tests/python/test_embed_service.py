"""ferry.embed_service against `ferry embed-serve`, a real process, in the CPU-only mode.

Two data-parallel x two tensor-parallel ranks run prefill-like (512 tokens in 4 requests) and
decode-like (64 tokens in 64 requests) steps over three layers; every output row is checked
byte for byte against the synthetic table's pattern at row ids from the pure-Python reference
of test_embed_ids.py (written from the specification, not from the C++). Then the faults: the
service killed in the middle of a step, a client killed, and bad requests.

The `ferry` binary is found next to the module's build tree (<build>/tools/ferry) or at
$FERRY_BIN.
"""

import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ferry
from ferry import embed_service
from test_embed_ids import Reference, expected_rows, synthetic_row

V, EOS, N, H, E, B, P = 1000, 2, 3, 2, 64, 97, 8
G = (N - 1) * H
ROW_BYTES = E // G * 2  # bf16
TOKEN_BYTES = E * 2
LAYERS = [0, 1, 2]
MAX_TOKENS, MAX_REQS = 512, 64
REFS = {layer: Reference(V, EOS, N, H, E, B, P=P, L=layer) for layer in LAYERS}


def ferry_bin():
    path = os.environ.get("FERRY_BIN")
    if not path:
        build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(ferry.__file__))))
        path = os.path.join(build, "tools", "ferry")
    if not os.path.exists(path):
        pytest.skip(f"no ferry binary at {path} (set FERRY_BIN)")
    return path


class Service:
    def __init__(self, tmp_path, wait_timeout=5.0, extra=()):
        self.socket = str(tmp_path / "embed.sock")
        ready = tmp_path / "ready"
        args = [
            ferry_bin(), "embed-serve", "--socket", self.socket, "--ready-file", str(ready),
            "--vocab", str(V), "--eos", str(EOS), "--ngram", str(N), "--heads", str(H),
            "--embed-dim", str(E), "--base-vocab", str(B), "--padding", str(P),
            "--layers", *map(str, LAYERS), "--threads", "2", "--chunk-tokens", "16",
            "--wait-timeout", str(wait_timeout), *extra,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out = self.proc.stdout.read().decode() if self.proc.poll() is not None else ""
                self.stop()
                pytest.fail(f"ferry embed-serve did not start: {out}")
            time.sleep(0.01)

    def client(self, dp, tp, tp_size, step_timeout_ms=5000):
        return embed_service.Client(
            self.socket, dp_rank=dp, tp_rank=tp, tp_size=tp_size, max_tokens=MAX_TOKENS,
            max_reqs=MAX_REQS, context_len=N - 1, token_bytes=TOKEN_BYTES, layers=LAYERS,
            step_timeout_ms=step_timeout_ms,
        )

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def service(tmp_path):
    s = Service(tmp_path)
    yield s
    s.stop()


def make_step(rng, num_reqs, num_tokens):
    lens = [num_tokens // num_reqs] * num_reqs
    lens[-1] += num_tokens - sum(lens)
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)

    def token():
        k = rng.random()
        return EOS if k < 0.05 else -1 if k < 0.07 else rng.randrange(0, V)

    tokens = [token() for _ in range(num_tokens)]
    ctx = [token() for _ in range(num_reqs * (N - 1))]
    return tokens, qsl, ctx


def write_inputs(c, step):
    tokens, qsl, ctx = step
    c.input_ids[: len(tokens)] = tokens
    c.query_start_loc[: len(qsl)] = qsl
    c.ngram_context[: len(qsl) - 1] = np.array(ctx, np.int32).reshape(-1, N - 1)


_row_cache = {}


def cached_row(r):
    row = _row_cache.get(r)
    if row is None:
        row = _row_cache[r] = synthetic_row(r, ROW_BYTES)
    return row


def check_outputs(c, step):
    tokens, qsl, ctx = step
    for slot, layer in enumerate(LAYERS):
        ids = REFS[layer].row_ids(tokens, qsl, ctx)
        want = expected_rows(cached_row, ids, ROW_BYTES)
        got = c.output(slot)[: len(tokens)].tobytes()
        assert got == want, f"layer {layer}: rows differ"


def forward(ranks, step):
    tokens, qsl, _ = step
    write_inputs(ranks[0], step)
    for c in ranks:
        c.prepare_forward(len(qsl) - 1, len(tokens))
    for c in ranks:
        for slot in range(c.slots):
            c.wait(slot)
        check_outputs(c, step)
    for c in ranks:
        c.release_outputs()


def test_two_dp_by_two_tp_prefill_and_decode(service):
    groups = [[service.client(dp, tp, 2) for tp in range(2)] for dp in range(2)]
    errors = []

    def run(dp):
        try:
            rng = random.Random(dp)
            for _ in range(2):
                forward(groups[dp], make_step(rng, 4, 512))   # prefill-like
                forward(groups[dp], make_step(rng, 64, 64))   # decode-like
        except Exception as e:  # reported below, on the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(dp,)) for dp in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for g in groups:
        for c in g:
            c.close()


def test_dummy_forward_is_local(service):
    c = service.client(0, 0, 1)
    c.output(0)[:8] = 7
    c.prepare_forward(8, 8, dummy=True)
    for slot in range(c.slots):
        c.wait(slot)
        assert c.flag(slot) == embed_service.FLAG_DONE
    assert not c.output(0)[:8].any()
    c.release_outputs()
    assert c.flag(0) == embed_service.FLAG_RESET


def failed_step(r0, r1, code):
    with pytest.raises(ferry.Error) as e:
        r0.wait(0)
    assert e.value.code == code, str(e.value)
    for slot in range(r0.slots):
        assert r0.flag(slot) == embed_service.FLAG_FAILED
        assert r1.flag(slot) == embed_service.FLAG_FAILED
        with pytest.raises(ferry.Error) as e1:
            r1.wait(slot)
        assert e1.value.code == "ABORTED"
    r0.release_outputs()
    r1.release_outputs()


@pytest.mark.parametrize(
    "what,reqs,tokens,edit,code",
    [
        ("decreasing query starts", 4, 64, lambda s: s[1].__setitem__(2, 1), "INVALID_ARGUMENT"),
        ("id >= V", 4, 64, lambda s: s[0].__setitem__(5, V), "OUT_OF_RANGE"),
        ("context id >= V", 4, 64, lambda s: s[2].__setitem__(1, V + 7), "OUT_OF_RANGE"),
    ],
)
def test_bad_requests_fail_flags_and_write_nothing(service, what, reqs, tokens, edit, code):
    r0, r1 = service.client(0, 0, 2), service.client(0, 1, 2)
    canary = 0x5A
    for c in (r0, r1):
        for slot in range(c.slots):
            c.output(slot)[:] = canary
    step = make_step(random.Random(3), min(reqs, MAX_REQS), min(tokens, MAX_TOKENS))
    if edit:
        edit(step)
    write_inputs(r0, step)
    r0.prepare_forward(reqs, tokens)
    failed_step(r0, r1, code)
    for c in (r0, r1):
        for slot in range(c.slots):
            assert (c.output(slot) == canary).all()
    forward([r0, r1], make_step(random.Random(4), 4, 128))  # the group goes on


def test_unknown_layer_is_refused(service):
    with pytest.raises(ferry.Error) as e:
        embed_service.Client(
            service.socket, max_tokens=8, max_reqs=2, context_len=N - 1,
            token_bytes=TOKEN_BYTES, layers=[0, 9],
        )
    assert e.value.code == "NOT_FOUND"


def test_service_killed_mid_step(service):
    r0, r1 = service.client(0, 0, 2), service.client(0, 1, 2)
    forward([r0, r1], make_step(random.Random(5), 4, 512))
    # Rank 1 holds its outputs: the next step is in flight at its first layer.
    r1.prepare_forward(1, 1, dummy=True)
    write_inputs(r0, make_step(random.Random(6), 64, 64))
    r0.prepare_forward(64, 64)
    time.sleep(0.05)
    start = time.monotonic()
    service.proc.kill()
    service.proc.wait()
    # Each client learns of the loss on its own connection's thread; rank 1's flags were set
    # DONE locally by its dummy forward, so its waits raise only once that thread marked them.
    for c in (r0, r1):
        while c.flag(0) != embed_service.FLAG_FAILED and time.monotonic() - start < 5:
            time.sleep(0.005)
    for c in (r0, r1):
        for slot in range(c.slots):
            with pytest.raises(ferry.Error) as e:
                c.wait(slot)
            assert e.value.code == "UNAVAILABLE", str(e.value)
            assert "connection lost" in e.value.message
    assert time.monotonic() - start < 5
    for c in (r0, r1):
        for slot in range(c.slots):
            assert c.flag(slot) == embed_service.FLAG_FAILED
    with pytest.raises(ferry.Error) as e:
        r0.prepare_forward(1, 1)
    assert e.value.code == "UNAVAILABLE"


CHILD = """
import sys, time
sys.path[:0] = {paths!r}
from ferry import embed_service
def client(tp):
    return embed_service.Client({socket!r}, dp_rank=1, tp_rank=tp, tp_size=2, max_tokens={mt},
                                max_reqs={mr}, context_len={ctx}, token_bytes={tb},
                                layers={layers!r})
c, c1 = client(0), client(1)
c.input_ids[:4] = [5, 6, 7, 8]
c.query_start_loc[:2] = [0, 4]
c.ngram_context[:1] = [[1, 1]]
c.prepare_forward(1, 4)
for s in range(c.slots):
    c.wait(s)
    c1.wait(s)
c.release_outputs()
c.prepare_forward(1, 4)   # rank 1 never released: the service waits on this process's outputs
print("ready", flush=True)
time.sleep(60)
"""


def test_killed_client_is_forgotten(service):
    code = CHILD.format(paths=sys.path, socket=service.socket, mt=MAX_TOKENS, mr=MAX_REQS,
                        ctx=N - 1, tb=TOKEN_BYTES, layers=LAYERS)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        r0 = service.client(0, 0, 1)
        rng = random.Random(7)
        forward([r0], make_step(rng, 4, 512))
        child.kill()
        child.wait()
        forward([r0], make_step(rng, 64, 64))
        # The dead client's rank registers again (a group of one now) once the service has
        # dropped both of its ranks.
        deadline = time.monotonic() + 5
        while True:
            try:
                again = service.client(1, 0, 1)
                break
            except ferry.Error as e:
                assert e.code in ("ALREADY_EXISTS", "INVALID_ARGUMENT"), str(e)
                assert time.monotonic() < deadline, str(e)
                time.sleep(0.01)
        forward([again], make_step(rng, 8, 256))
        forward([r0], make_step(rng, 2, 16))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_over_capacity_step_is_refused_and_the_client_goes_on(service):
    """Issue 9: the client refuses a step past its capacity; later steps are served."""
    c = service.client(0, 0, 1)
    with pytest.raises(ferry.Error) as e:
        c.prepare_forward(2, 2**21)
    assert e.value.code == "OUT_OF_RANGE", str(e.value)
    with pytest.raises(ferry.Error) as e:
        c.prepare_forward(MAX_REQS + 1, MAX_REQS + 1)
    assert e.value.code == "OUT_OF_RANGE", str(e.value)
    rng = random.Random(21)
    forward([c], make_step(rng, 4, 128))
    forward([c], make_step(rng, 2, 16))


def test_prepare_before_release_is_refused(service):
    """Issue 10: the waits of a step sent before the release would pass on the old flags."""
    c = service.client(0, 0, 1)
    rng = random.Random(22)
    first = make_step(rng, 4, 64)
    write_inputs(c, first)
    c.prepare_forward(4, 64)
    for slot in range(c.slots):
        c.wait(slot)
    write_inputs(c, make_step(rng, 4, 64))
    for dummy in (False, True):
        with pytest.raises(ferry.Error) as e:
            c.prepare_forward(4, 64, dummy=dummy)
        assert e.value.code == "FAILED_PRECONDITION", str(e.value)
    check_outputs(c, first)
    c.release_outputs()
    forward([c], make_step(rng, 4, 64))


def test_empty_datagram_is_answered_and_closed(service):
    """Issue 18: an empty datagram gets a reply and its connection is closed."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(5)
    s.connect(service.socket)
    s.send(b"")
    assert len(s.recv(65536)) > 0  # Registered(INVALID_ARGUMENT)
    assert s.recv(65536) == b""     # then closed
    s.close()
    forward([service.client(0, 0, 1)], make_step(random.Random(23), 2, 32))


def _tasks(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def _rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_idle_connections_cost_no_thread(service):
    """Issue 4: a connection is not a thread (62 idle ones used to reach a 64-thread limit)."""
    import socket

    before = _tasks(service.proc.pid)
    idle = []
    for _ in range(100):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(service.socket)
        idle.append(s)
    time.sleep(0.2)
    assert _tasks(service.proc.pid) == before
    forward([service.client(0, 0, 1)], make_step(random.Random(24), 2, 32))
    for s in idle:
        s.close()


def test_connections_past_the_limit_are_refused(tmp_path):
    """Issue 4: past --max-connections a connection is refused with RESOURCE_EXHAUSTED."""
    svc = Service(tmp_path, extra=("--max-connections", "2"))
    try:
        a, b = svc.client(0, 0, 1), svc.client(1, 0, 1)
        with pytest.raises(ferry.Error) as e:
            svc.client(2, 0, 1)
        assert e.value.code == "RESOURCE_EXHAUSTED", str(e.value)
        b.close()
        deadline = time.monotonic() + 5
        while True:
            try:
                c = svc.client(2, 0, 1)
                break
            except ferry.Error as e:
                assert e.code == "RESOURCE_EXHAUSTED" and time.monotonic() < deadline, str(e)
                time.sleep(0.01)
        forward([a], make_step(random.Random(25), 2, 32))
        forward([c], make_step(random.Random(26), 2, 32))
    finally:
        svc.stop()


def test_groups_claiming_large_capacity_leave_no_memory(service):
    """Issue 5: host-mode groups hold no staging; groups that emptied are freed."""
    before = _rss(service.proc.pid)
    clients = []
    for dp in range(4):
        c = embed_service.Client(
            service.socket, dp_rank=dp, max_tokens=2**20, max_reqs=MAX_REQS,
            context_len=N - 1, token_bytes=TOKEN_BYTES, layers=LAYERS,
        )
        c.query_start_loc[:2] = [0, 0]
        c.prepare_forward(1, 0)  # an empty step
        for slot in range(c.slots):
            c.wait(slot)
        c.release_outputs()
        clients.append(c)
    for c in clients:
        c.close()
    time.sleep(0.2)
    # The service used to zero-fill 2**20 x TOKEN_BYTES (128 MiB) per group and keep it.
    assert _rss(service.proc.pid) - before < 64 << 20


@pytest.mark.parametrize("option", ["step_timeout_ms", "connect_timeout_ms"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan"), 1e300])
def test_out_of_range_timeouts_are_invalid_argument(service, option, value):
    """Issue 14: a timeout must be finite and positive (0 used to fail every step at once)."""
    with pytest.raises(ferry.Error) as e:
        embed_service.Client(
            service.socket, max_tokens=8, max_reqs=2, context_len=N - 1,
            token_bytes=TOKEN_BYTES, layers=LAYERS, **{option: value},
        )
    assert e.value.code == "INVALID_ARGUMENT", str(e.value)


def _torch_cuda():
    try:
        import torch
    except ImportError:
        pytest.skip("no torch")
    if not torch.cuda.is_available():
        pytest.skip("no usable GPU: torch.cuda.is_available() is False")
    return torch


def test_cuda_outputs_from_torch_tensors(service):
    """CUDA mode: torch tensors as outputs and flags, stream waits, inputs copied from device."""
    torch = _torch_cuda()
    stream = torch.cuda.current_stream()
    ranks = []
    for tp in range(2):
        outs = [torch.zeros(MAX_TOKENS, TOKEN_BYTES, dtype=torch.uint8, device="cuda") for _ in LAYERS]
        flags = [torch.zeros(1, dtype=torch.int32, device="cuda") for _ in LAYERS]
        c = embed_service.cuda_client(
            service.socket, outs, flags, dp_rank=0, tp_rank=tp, tp_size=2, max_tokens=MAX_TOKENS,
            max_reqs=MAX_REQS, context_len=N - 1, token_bytes=TOKEN_BYTES, layers=LAYERS,
            step_timeout_ms=5000,
        )
        ranks.append((c, outs, flags))
    rng = random.Random(11)
    for num_reqs, num_tokens in [(4, 512), (64, 64)]:
        tokens, qsl, ctx = make_step(rng, num_reqs, num_tokens)
        src = [torch.tensor(x, dtype=torch.int32, device="cuda") for x in (tokens, qsl, ctx)]
        sources = tuple(t.data_ptr() for t in src)
        for c, _, _ in ranks:
            c.prepare_forward(num_reqs, num_tokens, stream=stream.cuda_stream,
                              sources=sources if c is ranks[0][0] else None)
        for c, outs, flags in ranks:
            for slot in range(c.slots):
                c.wait(slot, stream=stream.cuda_stream)
            stream.synchronize()
            for slot, layer in enumerate(LAYERS):
                assert int(flags[slot].item()) == embed_service.FLAG_DONE
                ids = REFS[layer].row_ids(tokens, qsl, ctx)
                want = expected_rows(cached_row, ids, ROW_BYTES)
                assert outs[slot][:num_tokens].cpu().numpy().tobytes() == want
        for c, _, _ in ranks:
            c.release_outputs(stream=stream.cuda_stream)
        stream.synchronize()
    for c, _, flags in ranks:
        assert all(int(f.item()) == embed_service.FLAG_RESET for f in flags)
        c.close()


def test_package_modules_are_the_python_files():
    # The extension's submodules must not shadow the package's Python files in sys.modules.
    assert embed_service.__file__.endswith("embed_service.py")
    assert callable(embed_service.cuda_client)
    assert ferry.embed.__file__.endswith("embed.py")
