"""ferry: moves LLM inference state (KV caches) between GPUs, processes and hosts.

The Python face of ferry's C++ engine (the role of MoRI-IO's IOEngine or NIXL's agent)::

    import numpy as np, ferry

    a, b = ferry.Engine(key="prefill"), ferry.Engine(key="decode")
    src = np.random.randint(0, 256, 1 << 20, dtype=np.uint8)
    dst = np.zeros(1 << 20, np.uint8)
    a_mem = a.register_memory(src)            # numpy arrays, bytearrays, any writable buffer
    b_mem = b.register_memory(dst)
    a.add_peer(b.describe().pack())           # descriptors travel as bytes (ZMQ, HTTP, ...)
    session = a.open_session(a_mem, ferry.MemoryDesc.unpack(b_mem.pack()))
    session.write(0, 0, 4096).wait()          # True on success, raises ferry.Error on failure
    session.write_batch([(0, 0, 64), (128, 4096, 64)], notification=b"layer-0").wait()
    b.pop_notifications()                     # [("prefill", b"layer-0")]

Errors raise ferry.Error with ``.code`` (a name from ferry.CODES, e.g. "OUT_OF_RANGE") and
``.message`` (INVALID_ARGUMENT raises ferry.InvalidArgumentError, also a ValueError). Transfer
waits and every call that can block release the GIL.

Completion without a thread per transfer: ``on_complete=fn`` on any post calls
``fn(code, message)`` once, with the GIL acquired, on the engine's completion thread;
``ferry.wait_all(transfers)`` / ``ferry.wait_any(transfers)`` wait on many. Notifications take a
``topic`` (``notify(peer, msg, topic="kv")``, ``pop_notifications(topic="kv")``), and
``after=[transfers]`` / ``Engine.notify_after`` order a notification after transfers of other
sessions.
"""

import atexit as _atexit

from . import _ferry, embed, embed_service, kv
from ._ferry import (
    CODES,
    MAX_DESCRIPTOR_BYTES,
    PROTOCOL_VERSION,
    Engine,
    EngineDesc,
    MemoryDesc,
    Session,
    Transfer,
    TransferPath,
    alloc_shared,
    cuda_available,
    cuda_unavailable_reason,
    get_log_level,
    set_log_level,
    system_info,
    version,
    wait_all,
    wait_any,
)

__all__ = [
    "CODES",
    "MAX_DESCRIPTOR_BYTES",
    "PROTOCOL_VERSION",
    "Engine",
    "EngineDesc",
    "Error",
    "InvalidArgumentError",
    "MemoryDesc",
    "Session",
    "Transfer",
    "TransferPath",
    "alloc_shared",
    "cuda_available",
    "cuda_unavailable_reason",
    "embed",
    "embed_service",
    "get_log_level",
    "kv",
    "log_to_python",
    "set_log_level",
    "system_info",
    "version",
    "wait_all",
    "wait_any",
]

__version__ = version()


class Error(Exception):
    """A ferry call failed.

    Attributes:
        code: the canonical code name, one of ferry.CODES ("OUT_OF_RANGE",
            "FAILED_PRECONDITION", "DEADLINE_EXCEEDED", ...). It says what to do: retry
            (UNAVAILABLE), fix state first (FAILED_PRECONDITION), fix the input
            (INVALID_ARGUMENT, OUT_OF_RANGE), ...
        message: the detail, e.g. "op 1: remote offset 4000 + 100 bytes exceeds region 2 ...".
    """

    def __init__(self, code: str = "UNKNOWN", message: str = ""):
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code


class InvalidArgumentError(Error, ValueError):
    """A ferry call refused an argument (code INVALID_ARGUMENT): an option out of range, a
    topic too long, ... Both a ferry.Error and a ValueError; the message names the argument."""


_ferry._set_error_class(Error)
_ferry._set_invalid_argument_class(InvalidArgumentError)


def _create(**options) -> Engine:
    """Engine.create(**options): the same as Engine(**options)."""
    return Engine(**options)


def _register_tensor(self: Engine, tensor, *, allowed_peers: "list[str] | None" = None) -> MemoryDesc:
    """Registers the memory of a contiguous torch tensor, on the CPU or on a CUDA device.

    Uses tensor.data_ptr(), numel() * element_size() and tensor.device; the tensor is kept
    alive until the region is deregistered. torch is not needed to import ferry.
    `allowed_peers`: engine keys of the only peers that may reach the region (None or empty:
    every peer), as for register_memory.
    """
    if not tensor.is_contiguous():
        raise Error("INVALID_ARGUMENT", "register_tensor needs a contiguous tensor")
    device_type = tensor.device.type
    if device_type == "cpu":
        kind, device = "host", -1
    elif device_type == "cuda":
        kind, device = "cuda", tensor.get_device()
    else:
        raise Error("INVALID_ARGUMENT", f"register_tensor cannot register {device_type} memory")
    size = tensor.numel() * tensor.element_size()
    return self.register_memory(tensor.data_ptr(), size, kind=kind, device=device, owner=tensor,
                                allowed_peers=list(allowed_peers or []))


_log_exit_hook = False


def log_to_python(logger_name: "str | None" = "ferry") -> None:
    """Sends ferry's log messages to Python's ``logging.getLogger(logger_name)`` instead of
    stderr; ``None`` sends them back to stderr.

    ferry still filters by its own level first (``ferry.set_log_level``, FERRY_LOG; "warn" by
    default), then the Python logger's level and handlers apply. Levels map to logging's
    (trace as 5, debug, info, warn as WARNING, error). Messages from ferry's own threads arrive
    on those threads with the GIL taken; none arrive once the interpreter is shutting down.
    """
    global _log_exit_hook
    _ferry._log_to_python(logger_name)
    if logger_name is not None and not _log_exit_hook:
        # Before the interpreter goes away: messages logged during shutdown go to stderr.
        _atexit.register(_ferry._log_to_python, None)
        _log_exit_hook = True


_engine_init = Engine.__init__


def _engine_init_from_env(self, **options):
    # The FERRY_* variables first (a bad one raises InvalidArgumentError naming it), then the
    # keyword arguments given: explicit beats the environment.
    kwargs = _ferry._env_engine_kwargs()
    kwargs.update(options)
    _engine_init(self, **kwargs)


_engine_init_from_env.__doc__ = (_engine_init.__doc__ or "") + (
    "\n\nUnset keyword arguments come from the FERRY_* environment variables "
    "(docs/configuration.md), then the defaults."
)
Engine.__init__ = _engine_init_from_env
Engine.create = staticmethod(_create)
Engine.register_tensor = _register_tensor
