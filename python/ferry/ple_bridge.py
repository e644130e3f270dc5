"""ferry.ple_bridge: ferry's stand-in for vLLM's PLE CPU-offload worker.

vLLM's ``PleOffloadConnector`` (GPU side) pushes, over one ZMQ socket, one pickled
``PleOffloadRegistration`` per GPU worker and then a msgpack ``PleOffloadRequest`` per step. The
bridge binds that socket, decodes both, and serves every step through ``ferry embed-serve`` as
its client (host mode, one client per data-parallel rank). It then copies the rows into every
tensor-parallel rank's output buffer and sets that rank's semaphore flag the way vLLM's worker
does: wait until the flag is 0 (vLLM released the previous step), copy the rows, then write 1.
On the GPU these are stream operations (cuStreamWaitValue32 EQ 0, an async copy,
cuStreamWriteValue32), so vLLM's wait (WaitValue32 EQ 1) passes only after the rows landed.

::

    python3 -m ferry.ple_bridge --ipc-path ipc:///tmp/<uuid> --embed-socket /run/ferry-embed.sock \\
        --num-workers 2 [--layers 0] [--ready-file F | --ready-fd N --death-fd M]

or from Python, in place of vLLM's ``PleOffloadWorker.make_process``:
``p = ferry.ple_bridge.spawn(ipc_addr, embed_socket, num_workers); p.wait_for_ready(600)``.

A step ferry fails writes ferry's FLAG_FAILED (2) into the flags instead of 1 (never rows of a
failed step behind a DONE flag; vLLM's own wait, EQ 1, does not pass on it). Malformed frames
are logged and dropped; a lost service or a flag vLLM never resets stops the bridge (exit 1).
docs/ple.md has the whole contract.
"""

import argparse
import ctypes
import dataclasses
import io
import json
import logging
import multiprocessing.connection
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import zmq

import ferry
from . import embed_service

log = logging.getLogger("ferry.ple_bridge")

FLAG_RESET, FLAG_DONE = 0, 1  # vLLM's CpuGpuSemaphore.RESET_VALUE and DONE_VALUE
FLAG_FAILED = embed_service.FLAG_FAILED
MAX_FRAME = 4 << 20  # a registration is a few KiB; larger frames are not vLLM's
VLLM_PROTOCOL = "vllm.v1.ple_offload.protocol"
# ferry client errors after which the client is unusable (the service is gone or stalled).
_FATAL = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "FAILED_PRECONDITION")


@dataclasses.dataclass
class PleOffloadRegistration:
    """vLLM's registration (vllm/v1/ple_offload/protocol.py), decoded."""
    worker_id: int
    tp_rank: int
    dp_rank: int
    gpu_output_buffers: dict
    sem_flag_tensors: dict
    input_ids_buf: object
    query_start_loc_buf: object
    ngram_context_buf: object


@dataclasses.dataclass(frozen=True)
class PleOffloadRequest:
    dp_rank: int
    num_tokens: int
    num_reqs: int


class ProtocolError(ValueError):
    """A frame that is not what vLLM's connector sends."""


def encode_request(r):
    """The bytes msgspec.msgpack.encode gives a PleOffloadRequest: a map in field order."""
    return msgpack.packb({"dp_rank": r.dp_rank, "num_tokens": r.num_tokens, "num_reqs": r.num_reqs})


def decode_request(frame):
    """A PleOffloadRequest from its msgpack map; extra keys are ignored (as msgspec does)."""
    try:
        m = msgpack.unpackb(frame, raw=False, strict_map_key=True,
                            max_str_len=64, max_bin_len=0, max_array_len=16, max_map_len=16)
    except Exception as e:  # msgpack raises several types for malformed input
        raise ProtocolError(f"request is not msgpack: {e}") from None
    if not isinstance(m, dict):
        raise ProtocolError(f"request is a {type(m).__name__}, not a map")
    vals = []
    for k in ("dp_rank", "num_tokens", "num_reqs"):
        v = m.get(k)
        if type(v) is not int or not 0 <= v < 2**31:
            raise ProtocolError(f"request field {k} is {v!r}, not a non-negative int32")
        vals.append(v)
    return PleOffloadRequest(*vals)


_REBUILDS = ("rebuild_tensor", "rebuild_typed_storage", "rebuild_storage_filename",
             "rebuild_cuda_tensor", "rebuild_typed_storage_child", "rebuild_storage_empty")


class _Unpickler(pickle.Unpickler):
    """Resolves only what a registration holds: vLLM's dataclass (to ours) and torch's tensor
    rebuilders, classes and dtypes; anything else is refused, so a frame cannot run code."""

    def find_class(self, module, name):
        if (module, name) == (VLLM_PROTOCOL, "PleOffloadRegistration"):
            return PleOffloadRegistration
        try:
            import torch
            import torch.multiprocessing.reductions as red
        except ImportError:
            raise ProtocolError("decoding vLLM's registration needs torch") from None
        obj = None
        if module == "torch.multiprocessing.reductions" and name in _REBUILDS:
            obj = getattr(red, name, None)
        elif module == "torch" and name in ("Tensor", "Size", "device"):
            obj = getattr(torch, name)
        elif module in ("torch", "torch.storage", "torch.cuda") and name.endswith("Storage"):
            mod = {"torch": torch, "torch.storage": torch.storage, "torch.cuda": torch.cuda}[module]
            obj = getattr(mod, name, None)
            obj = obj if isinstance(obj, type) else None
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            obj = getattr(torch, name)
        if obj is None:
            raise ProtocolError(f"a registration never refers to {module}.{name}")
        return obj


def decode_registration(frame):
    """A PleOffloadRegistration from ForkingPickler's bytes (CPU tensors shared with the
    file_system strategy, CUDA tensors through CUDA IPC), with its fields checked."""
    if not frame.startswith(b"\x80"):
        raise ProtocolError("registration is not a pickle")
    try:
        reg = _Unpickler(io.BytesIO(frame)).load()
    except ProtocolError:
        raise
    except Exception as e:  # a corrupt pickle or a tensor torch cannot open
        raise ProtocolError(f"registration does not decode: {type(e).__name__}: {e}") from None
    if not isinstance(reg, PleOffloadRegistration):
        raise ProtocolError(f"registration is a {type(reg).__name__}")
    import torch
    for f in dataclasses.fields(PleOffloadRegistration):
        if f.name not in vars(reg):
            raise ProtocolError(f"registration lacks {f.name}")
    for k in ("worker_id", "tp_rank", "dp_rank"):
        v = getattr(reg, k)
        if type(v) is not int or not 0 <= v < 2**16:
            raise ProtocolError(f"registration {k} is {v!r}")
    outs, flags = reg.gpu_output_buffers, reg.sem_flag_tensors
    if not isinstance(outs, dict) or not isinstance(flags, dict) or not outs:
        raise ProtocolError("registration needs output buffers and flags by layer name")
    if list(outs) != list(flags) or not all(isinstance(k, str) for k in outs):
        raise ProtocolError("registration's output buffers and flags name different layers")
    for name in outs:
        o, f = outs[name], flags[name]
        if not isinstance(o, torch.Tensor) or o.dim() != 2 or not o.is_contiguous():
            raise ProtocolError(f"output buffer of {name} is not a contiguous 2-D tensor")
        if not isinstance(f, torch.Tensor) or f.dtype != torch.int32 or f.numel() != 1:
            raise ProtocolError(f"flag of {name} is not an int32 tensor of one element")
        if f.device != o.device:
            raise ProtocolError(f"flag and output buffer of {name} are on different devices")
    ins = [("input_ids_buf", 1), ("query_start_loc_buf", 1), ("ngram_context_buf", 2)]
    for k, dims in ins:
        t = getattr(reg, k)
        if t is None and k == "ngram_context_buf":
            continue
        if (not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != dims
                or t.device.type != "cpu" or not t.is_contiguous() or t.shape[0] < 1):
            raise ProtocolError(f"registration {k} is not a contiguous int32 {dims}-D CPU tensor")
    if reg.query_start_loc_buf.shape[0] < 2:
        raise ProtocolError("registration query_start_loc_buf holds fewer than 2 entries")
    return reg


def _host_view(t):
    """uint8 numpy view of a CPU tensor's bytes (any dtype, bf16 and fp8 included)."""
    n = t.numel() * t.element_size()
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(t.data_ptr())).reshape(
        t.shape[0], -1)


class _Driver:
    """The few CUDA driver calls the GPU path needs (stream memory operations, async copies,
    page-locking), through ctypes: no CUDA Python package is needed."""

    _P, _U64, _U32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32
    _ARGS = {  # name: argument types (None: defaults); the _v2 symbol where there is one
        "cuStreamWaitValue32": [_P, _U64, _U32, ctypes.c_uint],
        "cuStreamWriteValue32": [_P, _U64, _U32, ctypes.c_uint],
        "cuMemcpyHtoDAsync": [_U64, _P, ctypes.c_size_t, _P],
        "cuMemHostRegister": [_P, ctypes.c_size_t, ctypes.c_uint],
        "cuMemHostUnregister": [_P], "cuStreamQuery": [_P], "cuStreamDestroy": [_P],
        "cuStreamCreate": None, "cuDevicePrimaryCtxRetain": None, "cuCtxSetCurrent": None,
        "cuDeviceGet": None,
    }

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        for name, args in self._ARGS.items():
            fn = getattr(self.lib, name + "_v2", None) or getattr(self.lib, name)
            if args is not None:
                fn.argtypes = args
            setattr(self, name, fn)
        self.ctx = {}

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUDA driver error {rc}")

    def use_device(self, ordinal):
        """Makes the device's primary context (torch's) current on the calling thread."""
        if ordinal not in self.ctx:
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            self.check(self.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
            self.check(self.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self.ctx[ordinal] = ctx
        self.check(self.cuCtxSetCurrent(self.ctx[ordinal]), "cuCtxSetCurrent")


class _HostTarget:
    """An output buffer and flag in host memory (CPU tensors; what tests without a GPU use)."""

    def __init__(self, out, flag, token_bytes):
        self._keep = (out, flag)
        self.out = _host_view(out)
        self.flag = np.ctypeslib.as_array((ctypes.c_int32 * 1).from_address(flag.data_ptr()))

    def put(self, rows, n, ok, deadline):
        while self.flag[0] != FLAG_RESET:  # vLLM's release of the previous step
            if time.monotonic() > deadline:
                raise TimeoutError("vLLM did not reset a flag (host output) in time")
            time.sleep(20e-6)
        if ok:
            self.out[:n, : rows.shape[1]] = rows[:n]
        self.flag[0] = FLAG_DONE if ok else FLAG_FAILED

    def finish(self, deadline):
        pass


class _CudaTarget:
    """An output buffer and flag in another process's device memory (torch mapped them through
    CUDA IPC): flag==0 wait, copy and flag write on a stream of the bridge's own."""

    def __init__(self, drv, out, flag, token_bytes):
        self.drv, self._keep, self.device = drv, (out, flag), out.device.index
        self.out_ptr, self.flag_ptr = out.data_ptr(), flag.data_ptr()
        drv.use_device(self.device)
        s = ctypes.c_void_p()
        drv.check(drv.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")  # non-blocking
        self.stream = s

    def put(self, rows, n, ok, deadline):
        d = self.drv
        d.use_device(self.device)
        d.check(d.cuStreamWaitValue32(self.stream, self.flag_ptr, FLAG_RESET, 1), "cuStreamWaitValue32")
        if ok and n:
            d.check(d.cuMemcpyHtoDAsync(self.out_ptr, rows.ctypes.data, n * rows.shape[1],
                                        self.stream), "cuMemcpyHtoDAsync")
        value = FLAG_DONE if ok else FLAG_FAILED
        d.check(d.cuStreamWriteValue32(self.stream, self.flag_ptr, value, 0), "cuStreamWriteValue32")

    def finish(self, deadline):
        """Waits (polling, up to deadline) until the stream ran: the rows were read out of
        ferry's output, which the next step overwrites."""
        while True:
            rc = self.drv.cuStreamQuery(self.stream)
            if rc == 0:
                return
            if rc != 600:  # CUDA_ERROR_NOT_READY
                self.drv.check(rc, "cuStreamQuery")
            if time.monotonic() > deadline:
                raise TimeoutError("vLLM did not reset a flag (CUDA output) in time")
            time.sleep(20e-6)

    def close(self):
        self.drv.use_device(self.device)
        self.drv.cuStreamDestroy(self.stream)


class _Lane(threading.Thread):
    """One data-parallel rank: its ferry client, vLLM's inputs (TP0's) and every TP rank's
    targets; serves its requests in order (never drops one)."""

    def __init__(self, bridge, dp, regs, client, targets):
        super().__init__(name=f"ple-bridge-dp{dp}", daemon=True)
        self.bridge, self.dp, self.client, self.targets = bridge, dp, client, targets
        r0 = regs[0]
        self.ids = r0.input_ids_buf.numpy()
        self.qsl = r0.query_start_loc_buf.numpy()
        self.ctx = None if r0.ngram_context_buf is None else r0.ngram_context_buf.numpy()
        self._keep = r0
        self.queue = queue.Queue(maxsize=1024)

    def run(self):
        try:
            while True:
                req = self.queue.get()
                if req is None:
                    return
                self.serve(req)
        except Exception as e:  # the lane cannot go on; the bridge stops
            self.bridge.fail(f"data-parallel rank {self.dp}: {type(e).__name__}: {e}")

    def serve(self, req):
        c, n, r = self.client, req.num_tokens, req.num_reqs
        timeout = self.bridge.step_timeout
        error = None
        try:
            if n > len(self.ids) or r + 1 > len(self.qsl):
                raise ferry.Error("OUT_OF_RANGE", f"step of {n} tokens, {r} requests exceeds "
                                  f"{len(self.ids)} tokens, {len(self.qsl) - 1} requests")
            c.input_ids[:n] = self.ids[:n]
            # vLLM's worker reads min(qsl[-1], num_tokens) tokens; clamping keeps that.
            c.query_start_loc[: r + 1] = np.minimum(self.qsl[: r + 1], n)
            if self.ctx is not None:
                c.ngram_context[:r] = self.ctx[:r]
            c.prepare_forward(r, n)
        except ferry.Error as e:
            error = e
        deadline = time.monotonic() + timeout
        for slot, layer_targets in enumerate(self.targets):
            if error is None:
                try:
                    c.wait(slot)
                except ferry.Error as e:
                    error = e
            rows = c.output(slot)
            for t in layer_targets:
                t.put(rows, n, error is None, deadline)
        for layer_targets in self.targets:
            for t in layer_targets:
                t.finish(deadline)
        if error is not None and getattr(error, "code", "") in _FATAL:
            raise error
        c.release_outputs()
        self.bridge.count(error is None)
        if error is not None:
            log.error("dp %d step of %d tokens failed: %s", self.dp, n, error)


class Bridge:
    """Binds vLLM's socket, takes the registrations, then serves requests until stopped."""

    def __init__(self, ipc_addr, embed_socket, num_workers, layers=None, step_timeout=60.0,
                 connect_timeout=10.0):
        self.ipc_addr = ipc_addr if "://" in ipc_addr else "ipc://" + ipc_addr
        self.embed_socket, self.num_workers, self.layers = embed_socket, num_workers, layers
        self.step_timeout, self.connect_timeout = step_timeout, connect_timeout
        self.lanes, self.clients, self.cuda_targets, self.pinned = {}, [], [], []
        self.early, self.stats_lock, self.error = [], threading.Lock(), None
        self.stats = {"steps_ok": 0, "steps_failed": 0, "frames_rejected": 0}
        self.stop_event = threading.Event()
        self.drv = None
        self.zctx = zmq.Context()
        self.sock = self.zctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.ipc_addr)

    def fail(self, message):
        log.error("%s", message)
        self.error = self.error or message
        self.stop_event.set()

    def count(self, ok):
        with self.stats_lock:
            self.stats["steps_ok" if ok else "steps_failed"] += 1

    def _recv(self, timeout_s):
        """One single-part frame, or None when none came within timeout_s."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        parts = self.sock.recv_multipart(zmq.NOBLOCK)
        if len(parts) != 1:
            raise ProtocolError(f"a frame of {len(parts)} parts")
        return parts[0]

    def accept_registrations(self, timeout):
        """Reads num_workers registrations (requests that come first are kept for later),
        checks vLLM's rules, connects one ferry client per DP rank. Returns the layer names."""
        deadline, regs = time.monotonic() + timeout, {}
        while len(regs) < self.num_workers:
            left = deadline - time.monotonic()
            if left <= 0 or self.stop_event.is_set():
                raise TimeoutError(f"{len(regs)} of {self.num_workers} registrations in {timeout} s")
            frame = self._recv(min(left, 0.1))
            if frame is None:
                continue
            if not frame.startswith(b"\x80") or frame[1:2] > b"\x05":
                self.early.append(decode_request(frame))
                continue
            reg = decode_registration(frame)
            key = (reg.dp_rank, reg.tp_rank)
            if key in regs:
                raise ProtocolError(f"dp_rank {key[0]} tp_rank {key[1]} registered twice")
            regs[key] = reg
            log.info("registration %d of %d: dp %d tp %d, layers %s", len(regs),
                     self.num_workers, reg.dp_rank, reg.tp_rank, list(reg.gpu_output_buffers))
        return self._set_up(regs)

    def _set_up(self, regs):
        dps = sorted({dp for dp, _ in regs})
        tp_size = self.num_workers // len(dps)
        if dps != list(range(len(dps))) or len(dps) * tp_size != self.num_workers or any(
                sorted(tp for d, tp in regs if d == dp) != list(range(tp_size)) for dp in dps):
            raise ProtocolError(f"registered ranks {sorted(regs)} are not a dp x tp grid")
        first = regs[(0, 0)]
        names = list(first.gpu_output_buffers)
        out0 = first.gpu_output_buffers[names[0]]
        token_bytes = out0.shape[1] * out0.element_size()
        layers = self.layers if self.layers is not None else list(range(len(names)))
        if len(layers) != len(names):
            raise ProtocolError(
                f"{len(names)} layers registered ({names}), --layers gives {len(layers)}")
        for reg in regs.values():
            if list(reg.gpu_output_buffers) != names:
                raise ProtocolError(f"dp {reg.dp_rank} tp {reg.tp_rank} registers layers "
                                    f"{list(reg.gpu_output_buffers)}, not {names}")
            for o in reg.gpu_output_buffers.values():
                if (o.shape[1] * o.element_size() != token_bytes or o.device.type != out0.device.type
                        or o.shape[0] < reg.input_ids_buf.shape[0]):
                    raise ProtocolError("output buffers differ in row bytes, kind or capacity")
        if out0.device.type == "cuda":
            self.drv = _Driver()
        for dp in dps:
            r0 = regs[(dp, 0)]
            ctx_len = 0 if r0.ngram_context_buf is None else r0.ngram_context_buf.shape[1]
            c = embed_service.Client(
                self.embed_socket, dp_rank=dp, tp_rank=0, tp_size=1,
                max_tokens=r0.input_ids_buf.shape[0], max_reqs=r0.query_start_loc_buf.shape[0] - 1,
                context_len=ctx_len, token_bytes=token_bytes, layers=layers,
                connect_timeout_ms=self.connect_timeout * 1000,
                step_timeout_ms=self.step_timeout * 1000)
            self.clients.append(c)
            targets = []
            for name in names:
                ts = []
                for tp in range(tp_size):
                    r = regs[(dp, tp)]
                    o, f = r.gpu_output_buffers[name], r.sem_flag_tensors[name]
                    ts.append(_CudaTarget(self.drv, o, f, token_bytes) if self.drv
                              else _HostTarget(o, f, token_bytes))
                targets.append(ts)
            if self.drv:
                self.cuda_targets += [t for ts in targets for t in ts]
                self._pin(c, out0.device.index)
            self.lanes[dp] = _Lane(self, dp, [regs[(dp, tp)] for tp in range(tp_size)], c, targets)
        for lane in self.lanes.values():
            lane.start()
        return sorted(names)

    def _pin(self, client, device):
        """Page-locks ferry's output rows so that the copies to vLLM are asynchronous DMA
        (PORTABLE: for the contexts of every TP rank's device)."""
        self.drv.use_device(device)
        for slot in range(client.slots):
            rows = client.output(slot)
            if self.drv.cuMemHostRegister(rows.ctypes.data, rows.nbytes, 1) == 0:
                self.pinned.append((device, rows))
            else:
                log.warning("could not page-lock ferry's output rows; copies are synchronous")

    def dispatch(self, req):
        lane = self.lanes.get(req.dp_rank)
        if lane is None:
            raise ProtocolError(f"request for unregistered dp_rank {req.dp_rank}")
        try:
            lane.queue.put_nowait(req)
        except queue.Full:
            raise ProtocolError(f"dp_rank {req.dp_rank} has more than 1024 steps queued") from None

    def serve(self):
        """Serves requests until stop_event (a signal, the death pipe or a failed lane)."""
        for req in self.early:
            self.dispatch(req)
        while not self.stop_event.is_set():
            try:
                frame = self._recv(0.1)
                if frame is not None:
                    if frame.startswith(b"\x80") and frame[1:2] <= b"\x05":
                        raise ProtocolError("a registration after READY")
                    self.dispatch(decode_request(frame))
            except ProtocolError as e:
                with self.stats_lock:
                    self.stats["frames_rejected"] += 1
                log.error("rejected a frame: %s", e)

    def close(self):
        for lane in self.lanes.values():
            try:
                lane.queue.put(None, timeout=1)
            except queue.Full:
                pass
            lane.join(timeout=self.step_timeout + 5)
        for c in self.clients:
            c.close()
        for device, rows in self.pinned:
            self.drv.use_device(device)
            self.drv.cuMemHostUnregister(rows.ctypes.data)
        for t in self.cuda_targets:
            t.close()
        self.sock.close(linger=0)
        self.zctx.term()
        if self.ipc_addr.startswith("ipc://"):  # the socket file stays behind otherwise
            try:
                os.unlink(self.ipc_addr[len("ipc://"):])
            except OSError:
                pass


def _parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m ferry.ple_bridge", description=__doc__.split("\n")[0])
    p.add_argument("--ipc-path", required=True, help="vLLM's ZMQ address (ipc://PATH, or a PATH)")
    p.add_argument("--embed-socket", required=True, help="ferry embed-serve's --socket")
    p.add_argument("--num-workers", type=int, required=True, help="vLLM's dp_size x tp_size")
    p.add_argument("--layers", type=int, nargs="+",
                   help="ferry layer index of each registered layer, in the registration's "
                        "order (default 0, 1, ...: vLLM's position in ple_layer_ids)")
    p.add_argument("--ready-timeout", type=float, default=600.0,
                   help="seconds for every registration (VLLM_PLE_OFFLOAD_READY_TIMEOUT)")
    p.add_argument("--step-timeout", type=float, default=60.0,
                   help="seconds a step may take, vLLM's release of the previous one included")
    p.add_argument("--connect-timeout", type=float, default=10.0,
                   help="seconds to connect to ferry embed-serve")
    p.add_argument("--ready-file", help="written as JSON with READY (or FAILURE)")
    p.add_argument("--ready-fd", type=int, help="a multiprocessing Connection's fd for READY")
    p.add_argument("--death-fd", type=int, help="a pipe's read end; its EOF stops the bridge")
    a = p.parse_args(argv)
    timeouts = (a.ready_timeout, a.step_timeout, a.connect_timeout)
    if not 1 <= a.num_workers <= 4096 or not all(0 < t <= 86400 for t in timeouts):
        p.error("--num-workers in [1, 4096], timeouts in (0, 86400] seconds")
    return a


def main(argv=None):
    a = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="ferry ple-bridge: %(levelname)s %(message)s")
    ready = None
    if a.ready_fd is not None:
        ready = multiprocessing.connection.Connection(a.ready_fd, readable=False)

    def report(msg):
        if ready is not None:
            ready.send(msg)
        if a.ready_file:
            with open(a.ready_file + ".tmp", "w") as f:
                json.dump(msg, f)
            os.replace(a.ready_file + ".tmp", a.ready_file)

    bridge = None
    try:
        try:  # now, so that the registrations' deadline is not spent importing it
            import torch  # noqa: F401
        except ImportError:
            log.warning("torch is not importable: vLLM's registrations cannot be decoded")
        bridge = Bridge(a.ipc_path, a.embed_socket, a.num_workers, a.layers, a.step_timeout,
                        a.connect_timeout)
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, lambda *_: bridge.stop_event.set())
        if a.death_fd is not None:
            threading.Thread(target=lambda: (os.read(a.death_fd, 1), bridge.stop_event.set()),
                             name="ple-bridge-death", daemon=True).start()
        names = bridge.accept_registrations(a.ready_timeout)
        report({"status": "READY", "layer_names": names})
        log.info("READY: %d workers, layers %s", a.num_workers, names)
    except Exception as e:
        log.error("setup failed: %s", e)
        report({"status": "FAILURE", "error": repr(e)})
        if bridge is not None:
            bridge.close()
        return 1
    bridge.serve()
    bridge.close()
    st = bridge.stats
    print(f"ferry ple-bridge: stopped: {st['steps_ok']} steps, {st['steps_failed']} failed, "
          f"{st['frames_rejected']} frames rejected", file=sys.stderr, flush=True)
    return 1 if bridge.error else 0


class BridgeProcess:
    """A bridge child process with vLLM's READY and death pipes (see spawn)."""

    def __init__(self, proc, ready, death_w):
        self.proc, self._ready, self._death_w = proc, ready, death_w

    def wait_for_ready(self, timeout):
        """The sorted layer names once READY; RuntimeError on FAILURE or exit, TimeoutError."""
        deadline = time.monotonic() + timeout
        while not self._ready.poll(0.1):
            if self.proc.poll() is not None:
                raise RuntimeError(f"ferry ple-bridge exited with {self.proc.returncode} before READY")
            if time.monotonic() > deadline:
                raise TimeoutError(f"ferry ple-bridge not READY in {timeout} s")
        try:
            msg = self._ready.recv()
        except EOFError:
            code = self.proc.wait(5)
            raise RuntimeError(f"ferry ple-bridge closed its READY pipe (exit {code})") from None
        if msg.get("status") != "READY":
            raise RuntimeError(f"ferry ple-bridge failed: {msg.get('error')}")
        return msg["layer_names"]

    def stop(self, timeout=10.0):
        if self._death_w is not None:
            os.close(self._death_w)
            self._death_w = None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


# The bridge unpickles torch tensors, so it imports torch anyway: first, before ferry's
# extension, because an extension built with another pybind11 than torch's, loaded before
# torch, can break torch's own import (seen with torch 2.11 beside pybind11 3.1: "free():
# invalid pointer" while torch.nn loads). Then the module runs as ``python3 -m`` would run it.
_LAUNCH = ("import runpy, sys\n"
           "try:\n"
           "    import torch  # noqa: F401\n"
           "except ImportError:\n"
           "    pass\n"
           "sys.argv[0] = 'ferry.ple_bridge'\n"
           "runpy.run_module('ferry.ple_bridge', run_name='__main__', alter_sys=True)\n")


def spawn(ipc_addr, embed_socket, num_workers, args=(), **popen):
    """Starts the bridge (``python3 -m ferry.ple_bridge``, torch imported first) with a READY pipe and a death pipe (the bridge
    stops when this process closes it or dies), as vLLM's PleOffloadWorker.make_process does."""
    ready_r, ready_w = multiprocessing.Pipe(duplex=False)
    death_r, death_w = os.pipe()
    cmd = [sys.executable, "-c", _LAUNCH, "--ipc-path", ipc_addr, "--embed-socket",
           embed_socket, "--num-workers", str(num_workers), "--ready-fd", str(ready_w.fileno()),
           "--death-fd", str(death_r), *args]
    try:
        proc = subprocess.Popen(cmd, pass_fds=(ready_w.fileno(), death_r), **popen)
    finally:
        ready_w.close()
        os.close(death_r)
    return BridgeProcess(proc, ready_r, death_w)


if __name__ == "__main__":
    sys.exit(main())
