"""ferry.kv: the KV-cache connector for prefill/decode disaggregation (vLLM, SGLang workers).

A worker registers its KV cache once and gets a Connector::

    import ferry, ferry.kv

    engine = ferry.Engine(key="decode-0")
    conn = ferry.kv.register_kv_caches(
        engine, kv_caches,                  # vLLM: {layer_name: tensor}; SGLang: [(k, v), ...]
        model="llama-3-8b", instance="decode-0", tp_rank=0, tp_size=1, block_tokens=16)
    peer.add_peer(conn.metadata())          # metadata bytes travel out of band (or serve_handshake)

    # write mode (push): the consumer allocates, the producer saves layer by layer
    conn.expect_write("req-1", "prefill-0", 0, blocks, num_tokens)        # consumer
    prod.save_layer("req-1", layer, blocks, ready=event)                  # producer, per layer
    prod.seal("req-1", num_layers)
    conn.wait_finished(timeout_ms=1000)     # [Finished("req-1", "done", ...)]

    # read mode (pull): the producer holds, the consumer reads
    params = prod.hold_for_read("req-1", blocks, num_tokens).pack()      # through the router
    conn.start_read(params, blocks)
    conn.wait_layer("req-1", layer, timeout_ms=1000)

Tensors may be torch tensors (CPU or CUDA; torch is not needed to import ferry) or numpy arrays.
Durations are milliseconds (arguments named *_ms), as everywhere in ferry's Python API. Errors
raise ferry.Error (INVALID_ARGUMENT: ferry.InvalidArgumentError, also a ValueError).
"""

import sys
from dataclasses import dataclass

from ._ferry import kv as _kv

CacheLayout = _kv.CacheLayout
Connector = _kv.Connector
Finished = _kv.Finished
LayerLayout = _kv.LayerLayout
ReadParams = _kv.ReadParams
TensorLayout = _kv.TensorLayout
WorkerId = _kv.WorkerId
WorkerMetadata = _kv.WorkerMetadata
check_compatible = _kv.check_compatible
make_layout = _kv.make_layout
KV_VERSION = _kv.KV_VERSION
TENSOR_ORDERS = _kv.TENSOR_ORDERS
TOPIC = _kv.TOPIC

__all__ = [
    "CacheLayout",
    "Connector",
    "Finished",
    "KV_VERSION",
    "LayerLayout",
    "ReadParams",
    "TENSOR_ORDERS",
    "TOPIC",
    "TensorLayout",
    "WorkerId",
    "WorkerMetadata",
    "check_compatible",
    "make_layout",
    "read_layout",
    "register_kv_caches",
]


def _invalid(message: str):
    from . import InvalidArgumentError  # late: ferry/__init__.py may import this module early

    return InvalidArgumentError("INVALID_ARGUMENT", message)


@dataclass
class _View:
    """One tensor's memory: where it starts, its shape and byte strides, and what owns it."""

    name: str
    ptr: int
    shape: tuple
    strides: tuple  # bytes
    itemsize: int
    kind: str  # "host" or "cuda"
    device: int
    owner: object
    allocation: object  # equal for views of one allocation (a torch storage, a numpy base)

    def span(self):
        """[lo, hi): the bytes the tensor may touch (strides are non-negative)."""
        last = sum((n - 1) * s for n, s in zip(self.shape, self.strides))
        return self.ptr, self.ptr + last + self.itemsize


def _view(name: str, t) -> _View:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(t, torch.Tensor):
        strided = getattr(torch, "strided", None)
        if strided is not None and getattr(t, "layout", strided) != strided:
            raise _invalid(f"{name}: a {t.layout} tensor has no strided memory to register")
        for lazy, fix in (("is_conj", "resolve_conj"), ("is_neg", "resolve_neg")):
            if getattr(t, lazy, None) is not None and getattr(t, lazy)():
                raise _invalid(f"{name}: a view whose values are not in its memory ({lazy}()): "
                               f"pass t.{fix}()")
        dev = t.device.type
        if dev == "cuda":
            kind, device = "cuda", t.get_device()
        elif dev == "cpu":
            kind, device = "host", -1
        else:
            raise _invalid(f"{name}: cannot register {dev} memory (only CPU and CUDA)")
        es = t.element_size()
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        v = _View(name, t.data_ptr(), tuple(t.shape), tuple(s * es for s in t.stride()), es, kind, device, t,
                  ("torch", storage.data_ptr()))
    elif hasattr(t, "__array_interface__"):
        ai = t.__array_interface__
        ptr, readonly = ai["data"]
        if readonly:
            raise _invalid(f"{name}: the array is read-only (the connector writes into the cache)")
        typestr = ai["typestr"]
        if typestr[1] == "O" or not typestr[2:].isdigit():
            raise _invalid(f"{name}: dtype {typestr} is not plain data")
        itemsize = int(typestr[2:])
        shape = tuple(ai["shape"])
        strides = ai.get("strides")
        if strides is None:  # C-contiguous
            strides, step = [], itemsize
            for n in reversed(shape):
                strides.insert(0, step)
                step *= n
        root = t
        while getattr(root, "base", None) is not None:
            root = root.base
        v = _View(name, ptr, shape, tuple(strides), itemsize, "host", -1, t, ("array", id(root)))
    else:
        raise _invalid(f"{name}: expected a torch tensor or a numpy array, not {type(t).__name__}")
    if any(n == 0 for n in v.shape):
        raise _invalid(f"{name}: empty tensor of shape {list(v.shape)}")
    for axis, s in enumerate(v.strides):
        if s < 0:
            raise _invalid(f"{name}: axis {axis} has a negative stride")
    if v.strides[-1] != v.itemsize:
        raise _invalid(f"{name}: the last axis (head dim) must be contiguous, its stride is "
                       f"{v.strides[-1]} bytes for {v.itemsize}-byte elements")
    # Entries that share memory (an expanded view, overlapping as_strided strides) would take
    # the bytes of several blocks, tokens or heads: each axis, from the innermost out, must step
    # past everything inside it.
    inside = v.itemsize
    for stride, n, axis in sorted((s, n, a) for a, (n, s) in enumerate(zip(v.shape, v.strides)) if n > 1):
        if stride < inside:
            what = "stride 0 (an expanded view)" if stride == 0 else f"stride {stride} bytes"
            raise _invalid(f"{name}: axis {axis} has {what}, inside the {inside} bytes the axes within it "
                           "span: its entries would share memory")
        inside = stride * (n - 1) + inside
    return v


@dataclass
class _Tensor:
    """One K, V or latent tensor of a layer, as the connector sees it."""

    view: _View
    extra: int  # bytes from view.ptr (V inside a KV-first / blocks-first tensor)
    block_stride: int
    token_stride: int
    head_stride: int


@dataclass
class _Layer:
    order: str
    k: _Tensor
    v: object  # _Tensor or None (MLA)
    kernel_blocks: int
    kernel_block: int
    heads: int
    head_dim: int
    itemsize: int


def _token_axis(v: _View, a: int, b: int, block_tokens: int, heads, order_hint: str) -> int:
    """Which of axes a (tokens in NHD order) and b (heads) holds the tokens of a kernel block."""
    fits = [x for x in (a, b) if v.shape[x] <= block_tokens and block_tokens % v.shape[x] == 0]
    if heads is not None:
        by_heads = [x for x in fits if v.shape[a + b - x] == heads]
        if len(by_heads) == 1:
            return by_heads[0]
    if len(fits) == 1:
        return fits[0]
    if not fits:
        raise _invalid(f"{v.name}: neither axis {a} ({v.shape[a]}) nor axis {b} ({v.shape[b]}) of shape "
                       f"{list(v.shape)} is a block of tokens dividing block_tokens={block_tokens}")
    exact = [x for x in fits if v.shape[x] == block_tokens]
    if len(exact) == 1:
        return exact[0]
    raise _invalid(f"{v.name}: cannot tell tokens from heads on axes {a} ({v.shape[a]}) and {b} "
                   f"({v.shape[b]}) of shape {list(v.shape)}: pass layout='{order_hint}' or "
                   f"'{order_hint}_hnd' (or total_kv_heads=)")


def _blocked(v: _View, block_axis: int, tok: int, head, block_tokens: int, extra: int = 0):
    """A _Tensor with kernel blocks on block_axis, tokens on tok, heads on head (None: one)."""
    kb = v.shape[tok]
    if kb > block_tokens or block_tokens % kb:
        raise _invalid(f"{v.name}: axis {tok} ({kb} tokens) does not divide block_tokens={block_tokens}")
    hs = v.strides[head] if head is not None else v.shape[-1] * v.itemsize  # unused: one head
    return _Tensor(v, extra, v.strides[block_axis], v.strides[tok], hs), v.shape[block_axis], kb


def _token_major(v: _View, head, block_tokens: int):
    """A _Tensor of a [T, (H,) D] buffer (SGLang): blocks of block_tokens consecutive tokens."""
    hs = v.strides[head] if head is not None else v.shape[-1] * v.itemsize  # unused: one head
    t = _Tensor(v, 0, v.strides[0] * block_tokens, v.strides[0], hs)
    return t, v.shape[0] // block_tokens, block_tokens


def _layer(name: str, entry, block_tokens: int, heads, order):
    """Reads one layer's tensor(s) into a _Layer."""
    if isinstance(entry, (tuple, list)):
        if len(entry) != 2:
            raise _invalid(f"{name}: a layer given as a sequence must be (K, V), not {len(entry)} tensors")
        k, v = _view(f"{name}[K]", entry[0]), _view(f"{name}[V]", entry[1])
        if k.shape != v.shape or k.itemsize != v.itemsize:
            raise _invalid(f"{name}: K {list(k.shape)} and V {list(v.shape)} differ in shape or dtype")
        if order not in (None, "separate", "separate_hnd"):
            raise _invalid(f"{name}: layout='{order}' does not take separate (K, V) tensors")
        if len(k.shape) == 4:  # [N, bs, H, D] or [N, H, bs, D]
            tok = {"separate": 1, "separate_hnd": 2}.get(order) or _token_axis(k, 1, 2, block_tokens, heads, "separate")
            parts = [_blocked(x, 0, tok, 3 - tok, block_tokens) for x in (k, v)]
            order, h = ("separate_hnd" if tok == 2 else "separate"), k.shape[3 - tok]
        elif len(k.shape) == 3 and order != "separate_hnd":  # [T, H, D]: token-major (SGLang)
            parts = [_token_major(x, 1, block_tokens) for x in (k, v)]
            order, h = "separate", k.shape[1]
        else:
            raise _invalid(f"{name}[K]: separate K and V must be [N, bs, H, D], [N, H, bs, D] or "
                           f"[T, H, D], not shape {list(k.shape)}")
        (kt, n, kb), (vt, _, _) = parts
        return _Layer(order, kt, vt, n, kb, h, k.shape[-1], k.itemsize)
    t = _view(name, entry)
    nd = len(t.shape)
    if nd == 5:
        if order in ("kv_first", "kv_first_hnd"):
            kv_axis = 0
        elif order in ("blocks_first", "blocks_first_hnd"):
            kv_axis = 1
        elif order is not None:
            raise _invalid(f"{name}: layout='{order}' does not take a 5-dimensional tensor {list(t.shape)}")
        elif t.shape[0] == 2 and t.shape[1] != 2:
            kv_axis = 0
        elif t.shape[1] == 2 and t.shape[0] != 2:
            kv_axis = 1
        elif t.shape[0] == 2:
            raise _invalid(f"{name}: axes 0 and 1 of shape {list(t.shape)} both have size 2: pass "
                           "layout='kv_first' or 'blocks_first'")
        else:
            raise _invalid(f"{name}: shape {list(t.shape)} has K/V (size 2) on neither axis 0 "
                           "([2, N, bs, H, D]) nor axis 1 ([N, 2, bs, H, D])")
        if t.shape[kv_axis] != 2:
            raise _invalid(f"{name}: axis {kv_axis} of shape {list(t.shape)} must be 2 (K and V)")
        base = "kv_first" if kv_axis == 0 else "blocks_first"
        tok = {base: 2, base + "_hnd": 3}.get(order) or _token_axis(t, 2, 3, block_tokens, heads, base)
        block_axis = 1 - kv_axis
        kt, n, kb = _blocked(t, block_axis, tok, 5 - tok, block_tokens)
        vt, _, _ = _blocked(t, block_axis, tok, 5 - tok, block_tokens, extra=t.strides[kv_axis])
        return _Layer(base + ("_hnd" if tok == 3 else ""), kt, vt, n, kb, t.shape[5 - tok], t.shape[4], t.itemsize)
    if nd in (2, 3) and order in (None, "mla"):
        if nd == 3 and not (t.shape[1] == 1 and block_tokens > 1):  # [N, bs, latent]
            kt, n, kb = _blocked(t, 0, 1, None, block_tokens)
        else:  # [T, latent] or [T, 1, latent]: token-major, as SGLang's MLA buffers
            kt, n, kb = _token_major(t, None, block_tokens)
        return _Layer("mla", kt, None, n, kb, 1, t.shape[-1], t.itemsize)
    if order is not None:
        raise _invalid(f"{name}: layout='{order}' does not take a {nd}-dimensional tensor {list(t.shape)}")
    raise _invalid(f"{name}: cannot read a KV layout from shape {list(t.shape)}: expected [2, N, bs, H, D], "
                   "[N, 2, bs, H, D] (or their H/bs swapped), a (K, V) pair, or MLA [N, bs, latent]")


def _regions(views):
    """Groups views of one allocation (and tensors whose bytes overlap) into regions, in the
    order their first tensor was given: [[base, size, kind, device, [views]], ...]."""
    order = {id(v): i for i, v in enumerate(views)}
    groups = []
    for v in sorted(views, key=lambda v: (v.kind, v.device, v.span()[0])):
        lo, hi = v.span()
        last = groups[-1] if groups else None
        same = last and (last[2], last[3]) == (v.kind, v.device)
        if same and (lo < last[0] + last[1] or v.allocation == last[4][-1].allocation):
            last[1] = max(last[0] + last[1], hi) - last[0]
            last[4].append(v)
        else:
            groups.append([lo, hi - lo, v.kind, v.device, [v]])
    return sorted(groups, key=lambda g: min(order[id(v)] for v in g[4]))


def _entries(caches):
    if isinstance(caches, dict):
        items = [(str(k), v) for k, v in caches.items()]
    elif isinstance(caches, (list, tuple)):
        items = [(f"layer {i}", v) for i, v in enumerate(caches)]
    else:
        raise _invalid(f"caches must be a dict (layer name -> tensor) or a list, not {type(caches).__name__}")
    if not items:
        raise _invalid("caches: no layers")
    return items


def _read(caches, model, tp_rank, tp_size, dp_rank, block_tokens, layout, total_kv_heads):
    """(CacheLayout, region groups as _regions gives them) of `caches`."""
    if layout is not None and layout not in TENSOR_ORDERS:
        raise _invalid(f"layout must be one of {', '.join(TENSOR_ORDERS)}, not {layout!r}")
    if block_tokens <= 0:
        raise _invalid(f"block_tokens must be positive, not {block_tokens}")
    if tp_size <= 0:
        raise _invalid(f"tp_size must be positive, not {tp_size}")
    heads = None
    if total_kv_heads is not None:
        heads = total_kv_heads // tp_size if tp_size <= total_kv_heads else 1
    entries = _entries(caches)
    layers = [_layer(name, entry, block_tokens, heads, layout) for name, entry in entries]
    first, first_name = layers[0], entries[0][0]
    for (name, _), l in zip(entries, layers):
        for field in ("order", "kernel_block", "heads", "head_dim", "itemsize"):
            if getattr(l, field) != getattr(first, field):
                raise _invalid(f"{name}: {field} {getattr(l, field)} differs from {first_name}'s "
                               f"{getattr(first, field)}")
    mla = first.order == "mla"
    num_blocks = min(l.kernel_blocks for l in layers) // (block_tokens // first.kernel_block)
    if num_blocks == 0:
        raise _invalid(f"{first_name}: holds no whole block of block_tokens={block_tokens} tokens")
    if total_kv_heads is None:
        total_kv_heads = 1 if mla else first.heads * tp_size
    elif not mla and heads != first.heads:
        raise _invalid(f"{first_name}: holds {first.heads} heads, but total_kv_heads={total_kv_heads} "
                       f"over tp_size={tp_size} gives {heads} a rank")

    views = {}  # one per tensor object (K and V of a KV-first tensor share theirs)
    for l in layers:
        for t in (l.k, l.v):
            if t is not None:
                views.setdefault(id(t.view.owner), t.view)
    groups = _regions(list(views.values()))
    where = {id(v.owner): (i, g[0]) for i, g in enumerate(groups) for v in g[4]}

    def placed(t):
        region, base = where[id(t.view.owner)]
        return TensorLayout(region=region, offset=t.view.ptr - base + t.extra, block_stride=t.block_stride,
                            token_stride=t.token_stride, head_stride=t.head_stride)

    cache_layout = CacheLayout(
        model=model, dtype_bytes=first.itemsize, head_dim=first.head_dim, total_kv_heads=total_kv_heads,
        mla=mla, num_layers=len(layers), tp_rank=tp_rank, tp_size=tp_size, dp_rank=dp_rank,
        block_tokens=block_tokens,
        kernel_block_tokens=0 if first.kernel_block == block_tokens else first.kernel_block,
        num_blocks=num_blocks, region_bytes=[g[1] for g in groups],
        layers=[LayerLayout(placed(l.k), placed(l.v) if l.v is not None else None) for l in layers])
    cache_layout.validate()
    return cache_layout, groups


def read_layout(caches, *, model: str, tp_rank: int, tp_size: int, dp_rank: int = 0, block_tokens: int,
                layout=None, total_kv_heads=None) -> CacheLayout:
    """The CacheLayout that register_kv_caches() would build for `caches` (the same arguments),
    without registering anything: one region per allocation, in the order the tensors come."""
    return _read(caches, model, tp_rank, tp_size, dp_rank, block_tokens, layout, total_kv_heads)[0]


def register_kv_caches(engine, caches, *, model: str, instance: str, tp_rank: int, tp_size: int,
                       dp_rank: int = 0, block_tokens: int, layout=None, mode: str = "write",
                       role: str = "both", total_kv_heads=None, **options) -> Connector:
    """Registers a worker's KV cache with `engine` and returns its Connector.

    caches: a dict (layer name -> tensor, in layer order: vLLM's register_kv_caches) or a list,
    each entry one tensor or a (K, V) pair (SGLang's per-layer buffers). Tensors are torch
    tensors (CPU or CUDA) or numpy arrays; the layout is read from shapes and strides:
    [2, N, bs, H, D] (KV first: flash-attention), [N, 2, bs, H, D] (blocks first: FlashInfer),
    either with H and bs swapped (HND: told by which axis is a block of tokens), (K, V) pairs of
    [N, bs, H, D] / [N, H, bs, D] / [T, H, D] (token-major), MLA [N, bs, latent] / [T, latent].
    Actual strides are used, so permuted views work. A tensor whose token axis is smaller than
    block_tokens holds kernel blocks (block_tokens / bs of them per scheduler block).

    layout: a name from TENSOR_ORDERS to skip detection (e.g. when H == bs). total_kv_heads:
    the model's KV heads (default: the heads in a tensor times tp_size); needed when heads are
    replicated over more TP ranks than there are heads. Other keyword arguments are the
    Connector's (transfer_timeout_ms=..., ...).

    Each allocation's memory is registered once (tensors that overlap share a region) and held
    by the engine; the returned Connector has `.caches` (what was passed) and `.regions` (the
    MemoryDescs, for engine.deregister_memory after close()). Raises InvalidArgumentError for
    shapes it cannot read, naming the tensor and the axis.
    """
    cache_layout, groups = _read(caches, model, tp_rank, tp_size, dp_rank, block_tokens, layout, total_kv_heads)
    regions = []
    try:
        for base, size, kind, device, views in groups:
            owner = tuple(v.owner for v in views)
            regions.append(engine.register_memory(base, size, kind=kind, device=device, owner=owner))
        conn = Connector(engine, cache_layout, regions, instance=instance, role=role, mode=mode, **options)
    except BaseException:
        for r in regions:
            try:
                engine.deregister_memory(r)
            except Exception:  # the first error is the one to report
                pass
        raise
    conn.caches = caches
    conn.regions = regions
    return conn
