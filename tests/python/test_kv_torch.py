"""ferry.kv with real torch tensors: the layouts vLLM and SGLang allocate, views that must be
refused or that are handled through their strides, and transfers between two connectors of this
process with the bytes compared through torch. On the CPU here, and on CUDA where torch sees a
GPU. The whole module skips (with the reason) where torch cannot be imported."""

import pytest

import ferry
import ferry.kv as kv
from util import fresh_key

torch = pytest.importorskip("torch", reason="torch is not importable here (it is optional: python3-torch)")

LAYERS, N, BS, H, D = 2, 8, 16, 4, 8
IDENTITY = dict(model="torch-model", tp_rank=0, tp_size=1, block_tokens=BS)
PAD = BS  # SGLang's token-major buffers hold one page more than the blocks


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return request.param


def make_caches(order: str, device: str, dtype=None, wide: int = 1):
    """Per-layer caches in `order`, allocated as the frameworks do. `wide` > 1: each tensor is
    a view of the first D of wide * D elements of a larger buffer's head axis."""
    dtype = dtype or torch.bfloat16

    def z(*shape):
        t = torch.zeros(shape[:-1] + (shape[-1] * wide,), dtype=dtype, device=device)
        return t[..., :shape[-1]] if wide > 1 else t

    def layer():
        if order == "kv_first":  # vLLM, flash-attention: [2, N, bs, H, D]
            return z(2, N, BS, H, D)
        if order == "kv_first_hnd":  # vLLM's HND stride order: physically [2, N, H, bs, D]
            return z(2, N, H, BS, D).permute(0, 1, 3, 2, 4)
        if order == "blocks_first":  # vLLM, FlashInfer: [N, 2, bs, H, D]
            return z(N, 2, BS, H, D)
        if order == "blocks_first_hnd":
            return z(N, 2, H, BS, D)
        if order == "separate":
            return (z(N, BS, H, D), z(N, BS, H, D))
        if order == "separate_hnd":
            return (z(N, H, BS, D), z(N, H, BS, D))
        if order == "mla":  # vLLM's MLA: [N, bs, latent]
            return z(N, BS, D)
        if order == "sglang":  # SGLang's MHATokenToKVPool: k_buffer[i], v_buffer[i] of [T, H, D]
            return (z(N * BS + PAD, H, D), z(N * BS + PAD, H, D))
        if order == "sglang_mla":  # SGLang's MLATokenToKVPool: kv_buffer[i] of [T, 1, latent]
            return z(N * BS + PAD, 1, D)
        raise AssertionError(order)

    return {f"model.layers.{i}.self_attn.attn": layer() for i in range(LAYERS)}


def logical(order: str, entry):
    """The layer's K and V (V None for MLA) as [N, bs, heads, D] views of its memory."""
    if order in ("separate", "separate_hnd", "sglang"):
        k, v = entry
    elif order.startswith("kv_first"):
        k, v = entry[0], entry[1]
    elif order.startswith("blocks_first"):
        k, v = entry[:, 0], entry[:, 1]
    else:
        k, v = entry, None
    if order in ("blocks_first_hnd", "separate_hnd"):
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    elif order in ("sglang", "sglang_mla"):
        k = k[:N * BS].view(N, BS, -1, D)
        v = v[:N * BS].view(N, BS, -1, D) if v is not None else None
    elif order == "mla":
        k = k.unsqueeze(2)
    return k, v


READ_AS = {"sglang": "separate", "sglang_mla": "mla"}
ORDERS = ["kv_first", "kv_first_hnd", "blocks_first", "blocks_first_hnd", "separate", "separate_hnd", "mla",
          "sglang", "sglang_mla"]


@pytest.mark.parametrize("order", ORDERS)
def test_the_layouts_frameworks_allocate_are_read(order, device):
    caches = make_caches(order, device)
    got = kv.read_layout(caches, **IDENTITY)
    mla = order.endswith("mla")
    want = kv.make_layout(kv.CacheLayout(model="torch-model", dtype_bytes=2, head_dim=D,
                                         total_kv_heads=1 if mla else H, mla=mla, num_layers=LAYERS,
                                         block_tokens=BS, num_blocks=N), READ_AS.get(order, order))
    assert got.layers == want.layers and got.mla == mla
    if order in READ_AS:  # the token-major buffers' extra page is one more block
        assert got.num_blocks == N + PAD // BS
    else:
        assert got == want and got.region_bytes == want.region_bytes
    # The view of a wider head axis: the same strides, regions spanning the view only.
    if order != "sglang_mla":
        narrow = kv.read_layout(make_caches(order, device, wide=2), **IDENTITY)
        assert narrow.head_dim == D and narrow.num_blocks == got.num_blocks
        assert narrow.layers[0].k.token_stride == 2 * got.layers[0].k.token_stride


def test_views_whose_entries_share_memory_or_lie_elsewhere_are_refused(device):
    def message(t):
        with pytest.raises(ferry.InvalidArgumentError) as info:
            kv.read_layout([t], **IDENTITY)
        return info.value.message

    z = lambda *shape: torch.zeros(shape, dtype=torch.float16, device=device)  # noqa: E731
    assert "axis 0 has stride 0 (an expanded view)" in message(z(1, N, BS, H, D).expand(2, N, BS, H, D))
    # Heads 4 elements apart, each 8 long: they overlap.
    overlapping = z(2 * N * BS * H * D).as_strided((2, N, BS, H, D), (N * BS * H * D, BS * H * D, H * D, D // 2, 1))
    assert "axis 3 has stride 8 bytes" in message(overlapping)
    assert "last axis (head dim) must be contiguous" in message(z(2, N, BS, H, 2 * D)[..., ::2])
    assert "last axis (head dim) must be contiguous" in message(z(2, N, BS, D, H).transpose(3, 4))
    assert "is_neg()" in message(torch._neg_view(z(2, N, BS, H, D)))
    assert "has no strided memory" in message(z(2, N, BS, H, D).to_sparse())
    assert "cannot register meta memory" in message(torch.zeros((2, N, BS, H, D), device="meta"))
    # A slice of a larger pool of blocks is a view like any other.
    pool = z(2, 2 * N, BS, H, D)
    assert kv.read_layout([pool[:, N:]], **IDENTITY).num_blocks == N


class Worker:
    def __init__(self, instance: str, order: str, device: str, wide: int = 1, **options):
        self.order, self.device = order, device
        self.engine = ferry.Engine(key=fresh_key(instance), transports=["local"])
        self.caches = make_caches(order, device, wide=wide)
        self.conn = kv.register_kv_caches(self.engine, self.caches, instance=instance, **IDENTITY, **options)

    def kv(self, layer: int):
        k, v = logical(self.order, list(self.caches.values())[layer])
        return [x for x in (k, v) if x is not None]

    def tokens(self, layer: int, blocks, n: int):
        """The first n tokens of `blocks` of each of K and V, as [n, heads * D] int16 (bitwise)."""
        return [x[blocks].reshape(len(blocks) * BS, -1)[:n].view(torch.int16) for x in self.kv(layer)]

    def finished(self):
        out = []
        for _ in range(50):
            out += self.conn.wait_finished(100)
            if out:
                break
        return out

    def close(self):
        self.conn.close()
        self.engine.close()


@pytest.mark.parametrize("p_order,d_order,checksums,wide", [
    ("blocks_first", "kv_first_hnd", False, 1),
    ("kv_first", "separate_hnd", True, 1),
    ("separate", "blocks_first_hnd", True, 2),  # the consumer's tensors: views of half a head axis
    ("sglang", "kv_first", True, 1),
    ("mla", "sglang_mla", True, 1),
])
def test_a_transfer_between_two_connectors_moves_the_bytes(p_order, d_order, checksums, wide, device):
    p = Worker("prefill", p_order, device, checksums=checksums)
    d = Worker("decode", d_order, device, wide=wide, checksums=checksums)
    try:
        p.conn.add_peer(d.conn.metadata())
        d.conn.add_peer(p.conn.metadata())
        pb, db, ntok = [3, 4, 6], [7, 0, 2], 40
        d.conn.expect_write("r", "prefill", 0, db, ntok)
        gen = torch.Generator().manual_seed(7)
        for layer in range(LAYERS):
            for x in p.kv(layer):
                bits = torch.randint(-(1 << 15), 1 << 15, x[pb].shape, dtype=torch.int16, generator=gen)
                x[pb] = bits.view(x.dtype).to(device)
            ready = None
            if device == "cuda":  # the layer's copies are ready when the stream's event is
                ready = torch.cuda.Event()
                ready.record()
            p.conn.save_layer("r", layer, pb, ready=ready)
        p.conn.seal("r", LAYERS)
        (fd,), (fp,) = d.finished(), p.finished()
        assert (fd.outcome, fd.code, fp.outcome) == ("done", "OK", "done"), fd.message
        for layer in range(LAYERS):
            for got, want in zip(d.tokens(layer, db, ntok), p.tokens(layer, pb, ntok)):
                assert torch.equal(got.cpu(), want.cpu())
            # Nothing else of the consumer's cache changed: tokens past ntok, other blocks.
            for x in d.kv(layer):
                assert not x[db].reshape(len(db) * BS, -1)[ntok:].view(torch.int16).any()
                others = [b for b in range(N) if b not in db]
                assert not x[others].view(torch.int16).any()
        for entry in d.caches.values():  # a view's buffer holds nothing outside the view
            for t in entry if isinstance(entry, tuple) else (entry,):
                base = t._base if t._base is not None else t
                assert int(base.view(torch.int16).ne(0).sum()) == int(t.view(torch.int16).ne(0).sum())
        assert d.conn.stats()["checksum_failures"] == 0
    finally:
        p.close()
        d.close()


def test_block_ids_may_be_torch_tensors(device):
    p, d = Worker("prefill", "kv_first", device), Worker("decode", "kv_first", device)
    try:
        p.conn.add_peer(d.conn.metadata())
        d.conn.add_peer(p.conn.metadata())
        d.conn.expect_write("t", "prefill", 0, torch.tensor([5, 1]), 32)  # CPU tensors, as schedulers keep
        for layer in range(LAYERS):
            p.conn.save_layer("t", layer, torch.tensor([2, 3], dtype=torch.int32))
        p.conn.seal("t", LAYERS)
        (fd,), (fp,) = d.finished(), p.finished()
        assert (fd.outcome, fd.blocks, fp.blocks) == ("done", [5, 1], [2, 3])
        with pytest.raises(ferry.Error):
            p.conn.save_layer("u", 0, torch.tensor([1.5]))
    finally:
        p.close()
        d.close()
