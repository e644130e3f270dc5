"""Engine's options: construction, every keyword argument, values out of range."""

import pytest

import ferry
from util import fresh_key


def error_code(fn, *args, **kwargs) -> str:
    with pytest.raises(ferry.Error) as info:
        fn(*args, **kwargs)
    return info.value.code


# ---- construction -------------------------------------------------------------------------


def test_engine_options_and_properties():
    key = fresh_key("opts")
    with ferry.Engine(key=key, default_deadline_ms=500, copy_threads=2, transports=["local"]) as e:
        assert e.key == key
        assert e.transports == ["local"]
        assert e.describe().key == key
        assert not e.closed
        assert key in repr(e)
    assert e.closed


def test_create_is_the_constructor():
    e = ferry.Engine.create(key=fresh_key("create"), copy_threads=1)
    assert isinstance(e, ferry.Engine)
    e.close()


def test_default_keys_are_unique():
    with ferry.Engine() as a, ferry.Engine() as b:
        assert a.key and b.key and a.key != b.key


@pytest.mark.parametrize(
    "options",
    [
        {"default_deadline_ms": 0},
        {"default_deadline_ms": -5},
        {"default_deadline_ms": float("nan")},
        {"default_deadline_ms": float("inf")},
        {"key": "k" * 300},
        {"default_deadline_ms": 1e300},
        {"copy_threads": 100000},
        {"copy_threads": 1025},
        {"copy_threads": -1},
        {"copy_threads": 100000, "transports": ["local"]},
        {"max_pending_notifications": 0},
        {"max_notification_bytes": 0},
        {"max_notification_bytes": 2 << 20, "max_pending_notification_bytes": 1 << 20},
    ],
)
def test_bad_options_are_invalid_arguments(options):
    assert error_code(ferry.Engine, **options) == "INVALID_ARGUMENT"


def test_a_copy_thread_that_cannot_start_is_resource_exhausted():
    # In a child whose address space has no room for 1,024 thread stacks: the engine fails
    # to start with RESOURCE_EXHAUSTED, and the process lives on.
    import subprocess
    import sys

    child = """
import resource, sys
import ferry
with open("/proc/self/status") as f:
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), resource.RLIM_INFINITY))
try:
    ferry.Engine(copy_threads=1024, transports=["local"])
except ferry.Error as e:
    print(e.code)
    sys.exit(0)
print("started")
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "RESOURCE_EXHAUSTED", out.stdout + out.stderr


def test_the_notification_backlog_is_bounded_by_bytes():
    with ferry.Engine(
        key=fresh_key("backlog"), transports=["local"], max_pending_notification_bytes=256 << 10
    ) as e:
        for _ in range(4):
            e.notify(e.key, b"n" * (64 << 10))
        assert error_code(e.notify, e.key, b"n") == "RESOURCE_EXHAUSTED"
        assert len(e.pop_notifications()) == 4
        e.notify(e.key, b"n")


def test_unknown_transport_is_unavailable():
    assert error_code(ferry.Engine, transports=["carrier-pigeon"]) == "UNAVAILABLE"


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        ferry.Engine("positional-key")


def test_every_engine_option_is_taken():
    with ferry.Engine(
        key=fresh_key("all"), default_deadline_ms=5000, deregister_timeout_ms=2000, copy_threads=2,
        parallel_copy_bytes=1 << 20, pin_host_memory=False, merge_adjacent_ops=False,
        transports=["local"], max_notification_bytes=1024, max_pending_notifications=8,
        max_pending_notification_bytes=8192, listen_host="127.0.0.1", listen_port=0,
        max_pending_handshakes=8, max_connections=16, handshake_timeout_ms=1000, lanes=2, workers=1,
        post_batch=64, progress="polling", rma="never", max_am_bytes=1 << 20,
        connect_timeout_ms=1000, revoke_timeout_ms=1000, call_timeout_ms=1000,
        max_pending_notifications_per_peer=4, shm_max_connections=4, shm_allowed_uids=[65534],
        wait_spin_ms=0.5,
    ) as e:
        assert e.transports == ["local"]
        e.notify(e.key, b"x" * 1024)
        assert error_code(e.notify, e.key, b"x" * 1025) == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    "options, field",
    [
        ({"progress": "busy"}, "progress"),
        ({"rma": "sometimes"}, "rma"),
        ({"listen_port": 70000}, "listen_port"),
        ({"lanes": -1}, "lanes"),
        ({"max_am_bytes": -5}, "max_am_bytes"),
        ({"copy_threads": -1}, "copy_threads"),
        ({"connect_timeout_ms": float("nan")}, "connect_timeout_ms"),
        ({"deregister_timeout_ms": -1}, "deregister_timeout"),
        ({"revoke_timeout_ms": 0}, "revoke_timeout"),
        ({"wait_spin_ms": 1001}, "wait_spin"),
        ({"wait_spin_ms": -1}, "wait_spin"),
        ({"shm_allowed_uids": [-1]}, "shm_allowed_uids"),
    ],
)
def test_bad_option_values_are_value_errors_naming_the_field(options, field):
    with pytest.raises(ValueError) as info:
        ferry.Engine(transports=["local"], **options)
    assert isinstance(info.value, ferry.Error) and info.value.code == "INVALID_ARGUMENT"
    assert field in info.value.message
