"""Disaggregated prefill and decode on one host, from Python: two processes, each a ferry.Engine
and a ferry.kv Connector over the `shm` transport, move the KV cache of a few requests in write
mode (the prefill side pushes each layer into blocks that the decode side allocated).

    prefill (this process, producer)        decode (a child process, consumer)
    conn.metadata() over a pipe        <->  the same; each side add_peer(the other's)
                                            expect_write(request, "prefill", 0, blocks, tokens)
    save_layer(request, layer, blocks) x L
    seal(request, L)                   ---> wait_finished: "done"; every element checked

Run: PYTHONPATH=<build>/python python3 examples/kv_two_process.py
"""

import multiprocessing as mp
import sys

import numpy as np

import ferry
import ferry.kv

LAYERS, BLOCKS, BLOCK_TOKENS, HEADS, HEAD_DIM = 4, 32, 16, 4, 64
# (request, tokens, the prefill side's blocks, the decode side's blocks): the two differ.
REQUESTS = [("req-0", 40, [0, 1, 2], [31, 30, 29]), ("req-1", 16, [3], [7]),
            ("req-2", 70, [4, 5, 6, 7, 8], [12, 3, 20, 21, 9])]


def make_worker(name, role):
    """An engine and a connector over a KV cache in shareable host memory (what shm peers map).

    Each layer is one bf16 tensor [2, N, bs, H, D] (flash-attention's KV-first layout), here a
    numpy uint16 array; torch tensors (CPU or CUDA) are registered the same way."""
    engine = ferry.Engine(key=name, transports=["shm"])
    shape = (2, BLOCKS, BLOCK_TOKENS, HEADS, HEAD_DIM)
    nbytes = int(np.prod(shape)) * 2
    caches = [ferry.alloc_shared(nbytes).view(np.uint16).reshape(shape) for _ in range(LAYERS)]
    conn = ferry.kv.register_kv_caches(
        engine, caches, model="example-model", instance=name, tp_rank=0, tp_size=1,
        block_tokens=BLOCK_TOKENS, role=role, mode="write")
    return engine, caches, conn


def slots(blocks, tokens):
    """Where each token of a request sits in a cache viewed as [2, N * bs, H, D]."""
    t = np.arange(tokens)
    return np.asarray(blocks)[t // BLOCK_TOKENS] * BLOCK_TOKENS + t % BLOCK_TOKENS


def kv_of(r, tokens):
    """Request r's KV (what a model's prefill would compute): [L, 2, tokens, H, D]."""
    rng = np.random.default_rng(r)
    return rng.integers(0, 1 << 16, (LAYERS, 2, tokens, HEADS, HEAD_DIM), dtype=np.uint16)


def wait_done(conn, request):
    """Waits (10 s at most) until `request` ended here; raises unless it ended done."""
    for _ in range(100):
        for f in conn.wait_finished(timeout_ms=100):
            if f.request == request:
                if f.outcome != "done":
                    raise RuntimeError(f"{request}: {f.outcome} {f.code} {f.message}")
                return
    raise TimeoutError(f"{request} did not end")


def meet(conn, pipe):
    """Exchanges metadata (engine descriptor, layout, regions) as bytes; add_peer checks that
    the two are compatible. conn.serve_handshake() / add_peer_from(address) is the other way."""
    pipe.send_bytes(conn.metadata())
    conn.add_peer(pipe.recv_bytes())


def decode(pipe):
    engine, caches, conn = make_worker("decode", "consumer")
    with conn:
        meet(conn, pipe)
        for r, (request, tokens, _, blocks) in enumerate(REQUESTS):
            conn.expect_write(request, "prefill", 0, blocks, tokens)
            wait_done(conn, request)
            want = kv_of(r, tokens)
            for layer, cache in enumerate(caches):
                got = cache.reshape(2, BLOCKS * BLOCK_TOKENS, HEADS, HEAD_DIM)[:, slots(blocks, tokens)]
                assert np.array_equal(got, want[layer]), f"{request} layer {layer} differs"
            print(f"decode: {request}: {want.nbytes} bytes, every one as sent")


def prefill(pipe):
    engine, caches, conn = make_worker("prefill", "producer")
    with conn:
        meet(conn, pipe)
        for r, (request, tokens, blocks, _) in enumerate(REQUESTS):
            kv = kv_of(r, tokens)
            for layer, cache in enumerate(caches):
                # "Compute" the layer, then save it; on a GPU pass ready=<torch.cuda.Event>.
                cache.reshape(2, BLOCKS * BLOCK_TOKENS, HEADS, HEAD_DIM)[:, slots(blocks, tokens)] = kv[layer]
                conn.save_layer(request, layer, blocks)
            conn.seal(request, LAYERS)
            wait_done(conn, request)  # every write landed: the blocks are free again


def main():
    # spawn: the child starts a fresh interpreter, so no engine thread is copied into it.
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=decode, args=(there,))
    child.start()
    try:
        prefill(here)
    finally:
        child.join(timeout=30)
    print(f"decode exited with {child.exitcode}")
    return 0 if child.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
