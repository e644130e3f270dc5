"""ferry.kv: layouts read from tensors, the value types, and two connectors in one process
(write mode, read mode, abort, a failing ready callable, stats)."""

import pickle
import sys
import threading
import time
import types

import numpy as np
import pytest

import ferry
import ferry.kv as kv
from util import fresh_key

LAYERS, N, BS, H, D = 3, 8, 16, 4, 8
IDENTITY = dict(model="test-model", tp_rank=0, tp_size=1, block_tokens=BS)


def identity(**kw) -> kv.CacheLayout:
    fields = dict(model="test-model", dtype_bytes=2, head_dim=D, total_kv_heads=H, num_layers=LAYERS,
                  block_tokens=BS, num_blocks=N)
    fields.update(kw)
    return kv.CacheLayout(**fields)


def caches_for(order: str, layers=LAYERS, n=N, bs=BS, h=H, d=D, dtype=np.uint16):
    """Per-layer numpy caches in `order`, as frameworks allocate them."""
    shapes = {
        "kv_first": (2, n, bs, h, d), "kv_first_hnd": (2, n, h, bs, d),
        "blocks_first": (n, 2, bs, h, d), "blocks_first_hnd": (n, 2, h, bs, d),
        "separate": (n, bs, h, d), "separate_hnd": (n, h, bs, d), "mla": (n, bs, d),
    }
    shape = shapes[order]
    if order.startswith("separate"):
        return {f"model.layers.{i}.attn": (np.zeros(shape, dtype), np.zeros(shape, dtype)) for i in range(layers)}
    return {f"model.layers.{i}.attn": np.zeros(shape, dtype) for i in range(layers)}


def invalid(fn, *args, **kwargs) -> str:
    with pytest.raises(ferry.InvalidArgumentError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    return info.value.message


# ---- layouts read from tensors --------------------------------------------------------------


@pytest.mark.parametrize("order", kv.TENSOR_ORDERS)
def test_every_standard_order_is_read_as_make_layout_builds_it(order):
    mla = order == "mla"
    got = kv.read_layout(caches_for(order), **IDENTITY)
    want = kv.make_layout(identity(mla=mla, total_kv_heads=1 if mla else H, head_dim=D), order)
    assert got == want
    assert got.layers == want.layers and got.region_bytes == want.region_bytes
    # The same order named explicitly reads the same.
    assert kv.read_layout(caches_for(order), layout=order, **IDENTITY) == want


def test_a_list_of_layers_and_one_allocation_for_every_layer():
    whole = np.zeros((LAYERS, 2, N, BS, H, D), np.uint16)  # one buffer, a view per layer
    got = kv.read_layout([whole[i] for i in range(LAYERS)], **IDENTITY)
    assert got == kv.make_layout(identity(), "kv_first", one_region=True)
    assert got.region_bytes == [whole.nbytes]


def test_permuted_views_are_read_from_their_strides():
    # Physically HND, viewed as the NHD shape [2, N, bs, H, D] (as vLLM's stride orders do).
    caches = [np.zeros((2, N, H, BS, D), np.uint16).transpose(0, 1, 3, 2, 4) for _ in range(LAYERS)]
    assert caches[0].shape == (2, N, BS, H, D)
    assert kv.read_layout(caches, **IDENTITY) == kv.make_layout(identity(), "kv_first_hnd")


def test_kernel_blocks_smaller_than_the_scheduler_block():
    caches = caches_for("kv_first", n=2 * N, bs=BS // 2)
    got = kv.read_layout(caches, total_kv_heads=H, **IDENTITY)  # 8 tokens, 4 heads: both divide 16
    assert (got.kernel_block_tokens, got.kernel_block, got.num_blocks) == (BS // 2, BS // 2, N)
    want = kv.make_layout(identity(kernel_block_tokens=BS // 2), "kv_first")
    assert got == want


def test_token_major_buffers_as_sglang_keeps_them():
    tokens = N * BS + 1  # SGLang pads one page; the partial block is not used
    pairs = [(np.zeros((tokens, H, D), np.uint16), np.zeros((tokens, H, D), np.uint16)) for _ in range(LAYERS)]
    got = kv.read_layout(pairs, **IDENTITY)
    want = kv.make_layout(identity(), "separate")
    assert got.layers == want.layers and got.num_blocks == N
    mla = kv.read_layout([np.zeros((tokens, 1, 12), np.uint16) for _ in range(2)], **IDENTITY)
    assert mla.mla and mla.head_dim == 12 and mla.num_blocks == N
    assert mla.layers[0].k == kv.TensorLayout(block_stride=BS * 24, token_stride=24, head_stride=24)


def test_heads_tp_and_dtype_come_from_the_tensors():
    got = kv.read_layout(caches_for("blocks_first", dtype=np.float32), model="m", tp_rank=1, tp_size=2,
                         dp_rank=3, block_tokens=BS)
    assert (got.dtype_bytes, got.head_dim, got.total_kv_heads, got.heads, got.first_head) == (4, D, 2 * H, H, H)
    assert (got.tp_rank, got.tp_size, got.dp_rank, got.model) == (1, 2, 3, "m")
    # Replicated heads: one head a rank, more ranks than heads.
    rep = kv.read_layout(caches_for("kv_first", h=1), model="m", tp_rank=5, tp_size=8, block_tokens=BS,
                         total_kv_heads=2)
    assert (rep.total_kv_heads, rep.heads) == (2, 1)


def test_heads_equal_to_the_block_size_need_the_layout_or_the_head_count():
    caches = caches_for("kv_first_hnd", h=BS)
    message = invalid(kv.read_layout, caches, **IDENTITY)
    assert "model.layers.0.attn" in message and "axes 2 (16) and 3 (16)" in message and "layout=" in message
    assert kv.read_layout(caches, layout="kv_first_hnd", **IDENTITY) == kv.make_layout(
        identity(total_kv_heads=BS), "kv_first_hnd")
    # Kernel blocks of 8 tokens and 4 heads both divide block_tokens: the head count tells them apart.
    small = caches_for("kv_first_hnd", n=2 * N, bs=8)
    assert "axes 2 (4) and 3 (8)" in invalid(kv.read_layout, small, **IDENTITY)
    got = kv.read_layout(small, total_kv_heads=H, **IDENTITY)
    assert got == kv.make_layout(identity(kernel_block_tokens=8), "kv_first_hnd")


def test_shapes_it_cannot_read_are_refused_naming_the_tensor_and_axis():
    good = caches_for("kv_first")
    cases = {
        "layer 0: cannot read a KV layout from shape [8, 16, 4, 8]": [np.zeros((N, BS, H, D), np.uint16)],
        "K/V (size 2) on neither axis 0": [np.zeros((3, N, BS, H, D), np.uint16)],
        "axes 0 and 1 of shape [2, 2, 16, 4, 8] both have size 2": [np.zeros((2, 2, BS, H, D), np.uint16)],
        "neither axis 2 (12) nor axis 3 (5)": [np.zeros((2, N, 12, 5, D), np.uint16)],
        "layer 0: the last axis (head dim) must be contiguous": [np.zeros((2, N, BS, H, 2 * D), np.uint16)[..., ::2]],
        "layer 0: the array is read-only": [np.broadcast_to(np.zeros(1, np.uint16), (2, N, BS, H, D))],
        "layer 1: head_dim 16 differs from layer 0's 8": [np.zeros((2, N, BS, H, D), np.uint16),
                                                          np.zeros((2, N, BS, H, 16), np.uint16)],
        "layer 0: K [8, 16, 4, 8] and V [8, 16, 4, 4] differ": [(np.zeros((N, BS, H, D), np.uint16),
                                                                  np.zeros((N, BS, H, 4), np.uint16))],
        "layer 0: a layer given as a sequence must be (K, V)": [(np.zeros((N, BS, H, D), np.uint16),) * 3],
        "layer 0: empty tensor": [np.zeros((2, 0, BS, H, D), np.uint16)],
        "layer 0: expected a torch tensor or a numpy array, not str": ["kv"],
        "caches: no layers": [],
        "layer 0: dtype |O is not plain data": [np.empty((2, N, BS, H, D), object)],
        # Writable but overlapping: heads 4 elements apart, each 8 long.
        "layer 0: axis 3 has stride 8 bytes, inside the 16 bytes": [np.lib.stride_tricks.as_strided(
            np.zeros(2 * N * BS * H * D, np.uint16), (2, N, BS, H, D), (N * BS * H * D * 2, BS * H * D * 2, H * D * 2,
                                                                      8, 2))],
    }
    for expected, caches in cases.items():
        assert expected in invalid(kv.read_layout, caches, **IDENTITY), expected
    assert "layout must be one of kv_first" in invalid(kv.read_layout, good, layout="nhd", **IDENTITY)
    assert "does not take a 5-dimensional" in invalid(kv.read_layout, good, layout="mla", **IDENTITY)
    assert "does not take separate (K, V)" in invalid(kv.read_layout, caches_for("separate"), layout="kv_first",
                                                      **IDENTITY)
    message = invalid(kv.read_layout, good, model="m", tp_rank=0, tp_size=1, block_tokens=BS, total_kv_heads=8)
    assert "holds 4 heads" in message
    # The C++ validation speaks too: a TP rank beyond the TP size.
    assert "tp_rank" in invalid(kv.read_layout, good, model="m", tp_rank=2, tp_size=2, block_tokens=BS)


def test_torch_cpu_tensors_are_read_like_arrays():
    torch = pytest.importorskip("torch")
    caches = {f"l{i}": torch.zeros((N, 2, H, BS, D), dtype=torch.bfloat16) for i in range(LAYERS)}
    assert kv.read_layout(caches, **IDENTITY) == kv.make_layout(identity(), "blocks_first_hnd")
    whole = torch.zeros((LAYERS, 2, N, BS, H, D), dtype=torch.float16)
    assert kv.read_layout(list(whole), **IDENTITY) == kv.make_layout(identity(), "kv_first", one_region=True)
    pairs = [(torch.zeros((N, BS, H, D), dtype=torch.int8), torch.zeros((N, BS, H, D), dtype=torch.int8))]
    assert kv.read_layout(pairs, **IDENTITY).dtype_bytes == 1


class FakeTensor:
    """What ferry.kv reads of a torch tensor, over a numpy array (torch itself is optional)."""

    def __init__(self, arr, device="cpu"):
        self.arr, self.device = arr, types.SimpleNamespace(type=device)
        self.shape = arr.shape

    def stride(self):
        return tuple(s // self.arr.itemsize for s in self.arr.strides)

    def element_size(self):
        return self.arr.itemsize

    def data_ptr(self):
        return self.arr.__array_interface__["data"][0]

    def get_device(self):
        return 0

    def untyped_storage(self):
        root = self.arr if self.arr.base is None else self.arr.base
        return types.SimpleNamespace(data_ptr=lambda: root.__array_interface__["data"][0])


def test_tensors_are_read_through_torchs_api(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(Tensor=FakeTensor))
    whole = np.zeros((LAYERS, N, 2, BS, H, D), np.uint16)
    layers = [FakeTensor(whole[i], "cuda") for i in range(LAYERS)]  # views of one storage
    assert kv.read_layout(layers, **IDENTITY) == kv.make_layout(identity(), "blocks_first", one_region=True)
    assert "cannot register mps memory" in invalid(kv.read_layout, [FakeTensor(whole[0], "mps")], **IDENTITY)
    # A connector that cannot be made leaves nothing registered.
    with ferry.Engine(key=fresh_key("fake"), transports=["local"]) as engine:
        pairs = [(FakeTensor(np.zeros((N, BS, H, D), np.uint16)), FakeTensor(np.zeros((N, BS, H, D), np.uint16)))]
        with pytest.raises(ferry.InvalidArgumentError):
            kv.register_kv_caches(engine, pairs, instance="x", role="nobody", **IDENTITY)
        assert engine._held_buffers() == 0
        conn = kv.register_kv_caches(engine, pairs, instance="x", **IDENTITY)
        assert engine._held_buffers() == 2 and conn.caches is pairs and len(conn.regions) == 2
        conn.close()


# ---- value types --------------------------------------------------------------------------


def test_value_types_pack_pickle_and_compare():
    layout = kv.make_layout(identity(), "kv_first")
    assert kv.CacheLayout.unpack(layout.pack()) == layout
    assert pickle.loads(pickle.dumps(layout)) == layout
    assert layout.compatibility_hash() == kv.CacheLayout.unpack(layout.pack()).compatibility_hash()
    other = layout.copy()
    other.head_dim = 16
    assert "head_dim" in invalid(kv.check_compatible, layout, other)
    kv.check_compatible(layout, kv.make_layout(identity(tp_size=2, tp_rank=1), "blocks_first"))
    params = kv.ReadParams(request="r", producer=kv.WorkerId("prefill", 1, 2), producer_tp_size=4,
                           blocks=[3, 1, 2], num_tokens=40)
    assert kv.ReadParams.unpack(params.pack()) == params == pickle.loads(pickle.dumps(params))
    assert str(params.producer) == "prefill/dp1/tp2"
    assert kv.WorkerId("a", 0, 1) < kv.WorkerId("a", 1, 0)
    assert len({kv.WorkerId("a"), kv.WorkerId("a")}) == 1
    with pytest.raises(ferry.Error):
        kv.ReadParams.unpack(b"\x01\x02")
    bad = layout.copy()
    bad.region_bytes = [1] * LAYERS
    assert "layer 0 k" in invalid(bad.validate)


# ---- two connectors in one process ---------------------------------------------------------


class Worker:
    """An engine over the local transport and a connector registered from numpy caches."""

    def __init__(self, instance, order, mode="write", **options):
        self.engine = ferry.Engine(key=fresh_key(instance), transports=["local"])
        self.caches = caches_for(order)
        self.order = order
        self.conn = kv.register_kv_caches(self.engine, self.caches, instance=instance, mode=mode, **IDENTITY,
                                          **options)

    def k_v(self, layer: int):
        """(K, V) of a layer as [N, bs, H, D] views (logical order, whatever the layout)."""
        c = list(self.caches.values())[layer]
        if self.order.startswith("separate"):
            k, v = c
        elif self.order.startswith("kv_first"):
            k, v = c[0], c[1]
        else:
            k, v = c[:, 0], c[:, 1]
        if self.order.endswith("_hnd"):
            k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        return k, v

    def tokens(self, layer: int, blocks, n: int):
        """The first n tokens held by `blocks`: (K, V), each [n, H, D]."""
        return tuple(x[blocks].reshape(-1, H, D)[:n] for x in self.k_v(layer))

    def fill(self, layer: int, blocks, seed: int):
        rng = np.random.default_rng(seed)
        for x in self.k_v(layer):
            x[blocks] = rng.integers(0, 1 << 16, x[blocks].shape, dtype=np.uint16)

    def finished(self, n=1, timeout_ms=5000):
        out = []
        for _ in range(50):
            out += self.conn.wait_finished(timeout_ms / 50)
            if len(out) >= n:
                break
        return out

    def close(self):
        self.conn.close()
        self.engine.close()


@pytest.fixture
def pd(request):
    made = []

    def make(p_order="blocks_first", d_order="kv_first_hnd", mode="write", **options):
        p, d = Worker("prefill", p_order, mode, **options), Worker("decode", d_order, mode, **options)
        p.conn.add_peer(d.conn.metadata())
        d.conn.add_peer(p.conn.metadata())
        made.extend([p, d])
        return p, d

    yield make
    for w in made:
        w.close()


@pytest.mark.parametrize("busy_poll", [False, True])
def test_write_mode_moves_every_byte_of_every_layer(pd, busy_poll):
    p, d = pd("blocks_first", "kv_first_hnd", busy_poll=busy_poll)
    before = time.monotonic_ns()
    pb, db, ntok = [3, 4, 6], [7, 0, 2], 40
    d.conn.expect_write("r1", "prefill", 0, db, ntok)
    for layer in range(LAYERS):
        p.fill(layer, pb, seed=layer)
        p.conn.save_layer("r1", layer, np.array(pb))
    p.conn.seal("r1", LAYERS)
    (fd,), (fp,) = d.finished(), p.finished()
    for f in (fd, fp):
        assert (f.request, f.outcome, f.code, f.message) == ("r1", "done", "OK", ""), f
    assert (fd.producer, fd.blocks, fp.producer, fp.blocks) == (False, db, True, pb)
    # When each side ended it, on the clock of time.monotonic_ns().
    assert before <= fd.at_ns <= time.monotonic_ns() and before <= fp.at_ns <= time.monotonic_ns()
    for layer in range(LAYERS):
        for got, want in zip(d.tokens(layer, db, ntok), p.tokens(layer, pb, ntok)):
            np.testing.assert_array_equal(got, want)
        # Tokens past num_tokens and blocks not named stay as they were.
        for x in d.k_v(layer):
            assert not x[db].reshape(-1, H, D)[ntok:].any()
            assert not np.delete(x, db, axis=0).any()
    stats_p, stats_d = p.conn.stats(), d.conn.stats()
    assert stats_p["layers_written"] == LAYERS and stats_p["requests_done"] == 1
    assert stats_p["bytes"] == LAYERS * 2 * ntok * H * D * 2
    assert stats_d["requests_done"] == 1 and stats_d["messages_received"] >= 1
    assert p.conn.pending == d.conn.pending == 0


def test_read_mode_waits_layer_by_layer(pd):
    p, d = pd("separate", "kv_first", mode="read")
    pb, db, ntok = [5, 6, 7], [0, 1, 3], 48
    for layer in range(LAYERS):
        p.fill(layer, pb, seed=10 + layer)
    params = p.conn.hold_for_read("rd", pb, ntok)
    assert (params.request, params.blocks, params.num_tokens) == ("rd", pb, ntok)
    d.conn.start_read(params.pack(), np.array(db, np.int32))  # as bytes, through the router
    for layer in range(LAYERS):
        d.conn.wait_layer("rd", layer, timeout_ms=5000)
        for got, want in zip(d.tokens(layer, db, ntok), p.tokens(layer, pb, ntok)):
            np.testing.assert_array_equal(got, want)
    assert [f.outcome for f in d.finished()] == ["done"]
    assert [f.outcome for f in p.finished()] == ["done"]
    assert d.conn.stats()["layers_read"] == LAYERS
    with pytest.raises(ferry.Error) as info:
        d.conn.wait_layer("rd", 0, timeout_ms=1)
    assert info.value.code == "NOT_FOUND"


def test_an_abort_ends_both_sides(pd):
    p, d = pd("kv_first", "kv_first")
    d.conn.expect_write("ab", "prefill", 0, [1, 2], 32)
    p.fill(0, [3, 4], seed=1)
    p.conn.save_layer("ab", 0, [3, 4])
    d.conn.abort("ab")
    (f,) = d.finished()
    assert (f.outcome, f.producer) == ("aborted", False)
    try:  # taken while the abort is on its way to the producer, refused once it ended there
        for layer in range(1, LAYERS):
            p.conn.save_layer("ab", layer, [3, 4])
        p.conn.seal("ab", LAYERS)
    except ferry.Error as e:
        assert e.code == "FAILED_PRECONDITION", e
    (f,) = p.finished()
    assert f.outcome == "aborted" and f.blocks == [3, 4]
    with pytest.raises(ferry.Error) as info:  # ended here and reported: nothing more of it is taken
        p.conn.save_layer("ab", 0, [3, 4])
    assert info.value.code == "FAILED_PRECONDITION"
    assert d.conn.stats()["requests_aborted"] == 1
    with pytest.raises(ferry.Error) as info:
        d.conn.abort("ab")
    assert info.value.code == "NOT_FOUND"


def test_ready_callables_run_on_ferrys_thread_and_a_raise_fails_the_request(pd):
    p, d = pd("kv_first", "kv_first")
    calls = []

    def ready(timeout_ms):
        calls.append((threading.get_ident(), timeout_ms))
        return True

    class Event:  # as torch.cuda.Event
        synchronized = 0

        def synchronize(self):
            Event.synchronized += 1

    d.conn.expect_write("ok", "prefill", 0, [1], 16)
    p.conn.save_layer("ok", 0, [2], ready=ready)
    p.conn.save_layer("ok", 1, [2], ready=Event())
    p.conn.save_layer("ok", 2, [2], ready=lambda timeout_ms: None)
    p.conn.seal("ok", LAYERS)
    assert [f.outcome for f in p.finished()] == ["done"]
    assert [f.outcome for f in d.finished()] == ["done"]
    assert len(calls) == 1 and calls[0][0] != threading.get_ident() and calls[0][1] > 0
    assert Event.synchronized == 1

    def broken(timeout_ms):
        raise RuntimeError("the layer's kernel failed")

    d.conn.expect_write("bad", "prefill", 0, [1], 16)
    p.conn.save_layer("bad", 0, [2], ready=broken)
    (f,) = p.finished()
    assert (f.request, f.outcome, f.code) == ("bad", "failed", "UNKNOWN")
    assert "RuntimeError: the layer's kernel failed" in f.message and "layer 0" in f.message
    assert [f.outcome for f in d.finished()] in (["failed"], ["aborted"])
    # A ferry.Error keeps its code; a falsy return is a deadline missed.
    d.conn.expect_write("late", "prefill", 0, [1], 16)
    p.conn.save_layer("late", 0, [2], ready=lambda timeout_ms: False)
    (f,) = p.finished()
    assert (f.outcome, f.code) == ("failed", "DEADLINE_EXCEEDED")
    with pytest.raises(TypeError):
        p.conn.save_layer("x", 0, [2], ready=3)
    assert p.conn.stats()["requests_failed"] == 2


def test_bad_calls_raise_with_codes(pd):
    p, d = pd("kv_first", "kv_first")
    codes = {}
    for name, fn in {
        "empty request": lambda: d.conn.expect_write("", "prefill", 0, [1]),
        "block beyond": lambda: d.conn.expect_write("x", "prefill", 0, [N]),
        "unknown producer": lambda: d.conn.expect_write("x", "nobody", 0, [1]),
        "negative block": lambda: d.conn.expect_write("x", "prefill", 0, [-1]),
        "float blocks": lambda: d.conn.expect_write("x", "prefill", 0, [1.5]),
        "bad params": lambda: d.conn.start_read(b"junk", [1]),
        "bad role": lambda: kv.Connector(p.engine, p.conn.layout, p.conn.regions, instance="z", role="x"),
        "bad timeout": lambda: kv.Connector(p.engine, p.conn.layout, p.conn.regions, instance="z",
                                            transfer_timeout_ms=0),
        "other model": lambda: d.conn.add_peer(kv.Connector(
            p.engine, kv.make_layout(identity(model="other", num_blocks=1), "kv_first"), p.conn.regions[:LAYERS],
            instance="other").metadata()),
    }.items():
        with pytest.raises(ferry.Error) as info:
            fn()
        codes[name] = info.value.code
    assert codes == {
        "empty request": "INVALID_ARGUMENT", "block beyond": "OUT_OF_RANGE",
        "unknown producer": "FAILED_PRECONDITION", "negative block": "INVALID_ARGUMENT",
        "float blocks": "INVALID_ARGUMENT", "bad params": "INVALID_ARGUMENT",
        "bad role": "INVALID_ARGUMENT", "bad timeout": "INVALID_ARGUMENT", "other model": "INVALID_ARGUMENT",
    }
    with pytest.raises(TypeError):
        kv.Connector(object(), p.conn.layout, p.conn.regions, instance="z")


def test_handshake_metadata_and_close(pd):
    p, d = pd("kv_first", "kv_first")
    meta = kv.WorkerMetadata.unpack(p.conn.metadata())
    assert meta.id == kv.WorkerId("prefill") == p.conn.id
    assert meta.layout == p.conn.layout and [r.size for r in meta.regions] == p.conn.layout.region_bytes
    assert meta.engine.key == p.engine.key
    address = p.conn.serve_handshake()
    assert address.startswith("127.0.0.1:")
    d.conn.add_peer_from(address)
    # The engine's close() leaves the connector working; its own close() ends it.
    p.engine.close()
    assert p.conn.pending == 0
    p.conn.close()
    assert p.conn.closed and "closed" in repr(p.conn)
    with pytest.raises(ferry.Error) as info:
        p.conn.metadata()
    assert info.value.code == "ABORTED"


def test_two_producer_ranks_fill_one_consumer_with_smaller_kernel_blocks():
    """TP 2 -> TP 1, KV-first NHD -> blocks-first with 8-token kernel blocks."""
    rng = np.random.default_rng(3)
    want = rng.integers(0, 1 << 16, (2, 2, 2 * BS, H, D), dtype=np.uint16)  # layer, K/V, token, head, dim
    workers = []
    try:
        def make(instance, rank, tp, shape):
            engine = ferry.Engine(key=fresh_key(instance), transports=["local"])
            caches = [np.zeros(shape, np.uint16) for _ in range(2)]
            conn = kv.register_kv_caches(engine, caches, model="m", instance=instance, tp_rank=rank, tp_size=tp,
                                         block_tokens=BS, total_kv_heads=H)
            workers.append((engine, conn))
            return conn, caches

        producers = [make("prefill", r, 2, (2, N, BS, H // 2, D)) for r in range(2)]
        consumer, d_caches = make("decode", 0, 1, (2 * N, 2, BS // 2, H, D))
        assert (consumer.layout.kernel_block_tokens, consumer.layout.num_blocks) == (BS // 2, N)
        for conn, _ in producers:
            conn.add_peer(consumer.metadata())
            consumer.add_peer(conn.metadata())
        pb, db = [1, 5], [3, 0]
        consumer.expect_write("tp", "prefill", 0, db, 2 * BS)
        for rank, (conn, caches) in enumerate(producers):
            heads = slice(rank * H // 2, (rank + 1) * H // 2)
            for layer in range(2):
                for i, b in enumerate(pb):
                    caches[layer][:, b] = want[layer, :, i * BS:(i + 1) * BS, heads]
                conn.save_layer("tp", layer, pb)
            conn.seal("tp", 2)
        assert [f.outcome for f in consumer.wait_finished(5000)] == ["done"]
        for conn, _ in producers:
            assert [f.outcome for f in conn.wait_finished(5000)] == ["done"]
        for layer in range(2):
            for i, b in enumerate(db):  # scheduler block b is kernel blocks 2b and 2b + 1
                got = np.concatenate([d_caches[layer][2 * b], d_caches[layer][2 * b + 1]], axis=1)
                np.testing.assert_array_equal(got, want[layer, :, i * BS:(i + 1) * BS])
    finally:
        for engine, conn in workers:
            conn.close()
            engine.close()
