"""ferry.embed_service: a GPU worker's client of ``ferry embed-serve`` (the embedding offload).

::

    c = ferry.embed_service.Client("/run/ferry-embed.sock", dp_rank=0, tp_rank=0, tp_size=1,
                                   max_tokens=8192, max_reqs=256, context_len=2,
                                   token_bytes=2560 * 2, layers=[0, 1, 2])
    c.input_ids[:n] = tokens; c.query_start_loc[: r + 1] = qsl; c.ngram_context[:r] = ctx
    c.prepare_forward(r, n)          # rank 0 sends the step; other ranks only pass through
    for slot in range(c.slots):
        c.wait(slot)                 # raises ferry.Error if the step failed or the service died
        rows = c.output(slot)[:n]    # uint8 [n, token_bytes]
    c.release_outputs()              # after the forward: the service may overwrite the outputs

Flags hold FLAG_RESET, FLAG_DONE or FLAG_FAILED; a wait passes on >= FLAG_DONE. A dummy
forward (``prepare_forward(r, n, dummy=True)``) sends nothing and satisfies the waits locally.
Every forward is released before the next is prepared (``prepare_forward`` raises
FAILED_PRECONDITION otherwise), and a step past max_tokens or max_reqs raises OUT_OF_RANGE
before anything is sent.
"""

from ._ferry import embed_service as _svc

Client = _svc.Client
FLAG_RESET = _svc.FLAG_RESET
FLAG_DONE = _svc.FLAG_DONE
FLAG_FAILED = _svc.FLAG_FAILED
PROTOCOL_VERSION = _svc.PROTOCOL_VERSION

__all__ = ["Client", "FLAG_DONE", "FLAG_FAILED", "FLAG_RESET", "PROTOCOL_VERSION", "cuda_client"]


def cuda_client(socket_path, outputs, flags, **options):
    """A CUDA-mode Client over torch tensors: ``outputs`` one contiguous CUDA tensor per layer
    of at least max_tokens x token_bytes bytes, ``flags`` one int32 CUDA tensor of one element
    per layer. The client keeps references to the tensors."""
    for t in list(outputs) + list(flags):
        if not t.is_cuda or not t.is_contiguous():
            raise ValueError("outputs and flags must be contiguous CUDA tensors")
    c = Client(
        socket_path, mode="cuda", device=outputs[0].get_device(),
        cuda_outputs=[t.data_ptr() for t in outputs], cuda_flags=[t.data_ptr() for t in flags],
        **options,
    )
    c._tensors = (list(outputs), list(flags))
    return c
