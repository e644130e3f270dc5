"""`ferry embed-serve`'s flags and paths, checked before anything is built (issue 12).

Each run ends at once with the exit status and message of its error; none builds a table.
"""

import os
import random
import subprocess
import time

import pytest

from test_embed_service import Service, ferry_bin, forward, make_step


def serve(*args, timeout=20):
    start = time.monotonic()
    p = subprocess.run([ferry_bin(), "embed-serve", *args], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - start


SMALL = ["--vocab", "1000", "--eos", "2", "--ngram", "3", "--heads", "2", "--embed-dim", "64",
         "--base-vocab", "97", "--padding", "8"]


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--threads", "100000"], "--threads"),            # issue 11
        (["--threads", "0"], "--threads"),
        (["--wait-timeout", "inf"], "--wait-timeout"),     # issue 14
        (["--wait-timeout", "nan"], "--wait-timeout"),
        (["--wait-timeout", "1e300"], "--wait-timeout"),
        (["--wait-timeout", "-1"], "--wait-timeout"),
        (["--layers", "5000"], "--layers"),                # also seen
        (["--layers", "1", "1"], "--layers"),
        (["--uva-probes", "-1"], "--uva-probes"),          # also seen
        (["--uva-reprobe-every", "-1"], "--uva-reprobe-every"),
        (["--chunk-tokens", "0"], "--chunk-tokens"),
        (["--max-connections", "0"], "--max-connections"),
    ],
)
def test_out_of_range_flags_are_invalid_argument(tmp_path, flags, named):
    # Default model flags: the checks come before the (95 GiB) table.
    rc, out, took = serve("--socket", str(tmp_path / "s.sock"), *flags)
    assert rc == 2, out
    assert "INVALID_ARGUMENT" in out and named in out, out
    assert took < 10


def test_table_larger_than_memory_is_refused(tmp_path):
    """Issue 7: the table's size is checked against the memory available, before it is built."""
    rc, out, took = serve("--socket", str(tmp_path / "s.sock"), "--base-vocab", "100000000000")
    assert rc == 1, out
    assert "RESOURCE_EXHAUSTED" in out and "GiB" in out and "--base-vocab" in out, out
    assert took < 10


def test_socket_in_a_missing_folder_is_refused_first(tmp_path):
    """Issue 7: the socket path is checked before the table is built."""
    rc, out, took = serve("--socket", str(tmp_path / "no" / "s.sock"))
    assert rc == 1, out
    assert "NOT_FOUND" in out and "--socket" in out, out
    assert took < 10


def test_socket_path_that_is_a_file_is_left_alone(tmp_path):
    """Issue 8: a path that is not a socket is refused, not deleted."""
    path = tmp_path / "s.sock"
    path.write_text("keep me")
    rc, out, _ = serve("--socket", str(path), *SMALL)
    assert rc == 1, out
    assert "FAILED_PRECONDITION" in out, out
    assert path.read_text() == "keep me"


def test_live_service_socket_is_not_taken_over(tmp_path):
    """Issue 8: a second service on a live service's socket is refused; the first serves on."""
    first = Service(tmp_path)
    try:
        rc, out, _ = serve("--socket", first.socket, *SMALL)
        assert rc == 1, out
        assert "ALREADY_EXISTS" in out, out
        forward([first.client(0, 0, 1)], make_step(random.Random(1), 2, 32))
    finally:
        first.stop()


def test_fifo_table_is_refused_without_blocking(tmp_path):
    """Also seen: a FIFO as --table used to hang startup in open()."""
    fifo = tmp_path / "table.fifo"
    os.mkfifo(fifo)
    rc, out, took = serve("--socket", str(tmp_path / "s.sock"), *SMALL, "--layers", "0",
                          "--table", str(fifo), timeout=10)
    assert rc == 2, out
    assert "not a regular file" in out, out
    assert took < 5


def test_fifo_ready_file_is_refused_without_blocking(tmp_path):
    """A FIFO as --ready-file would block the service's open() until a reader came."""
    fifo = tmp_path / "ready.fifo"
    os.mkfifo(fifo)
    rc, out, took = serve("--socket", str(tmp_path / "s.sock"), *SMALL, "--ready-file", str(fifo),
                          timeout=10)
    assert rc == 2, out
    assert "not a regular file" in out, out
    assert took < 5
