"""ferry's log from Python: set_log_level/get_log_level, FERRY_LOG read by the library, and
log_to_python forwarding ferry's messages to Python's logging (caplog)."""

import logging
import os
import socket
import subprocess
import sys

import pytest

import ferry
from util import fresh_key


@pytest.fixture
def ferry_logging():
    """ferry's messages go to logging.getLogger("ferry") for one test; level and sink restored."""
    before = ferry.get_log_level()
    ferry.log_to_python("ferry")
    yield
    ferry._ferry._log_to_python(None)
    ferry.set_log_level(before)


def _refused_ucx_engine():
    """Makes ferry log "transport ucx is not usable here" (INFO): its port is taken."""
    if "ucx" not in ferry.system_info()["transports_compiled"]:
        pytest.skip("ucx is not compiled into this build")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ferry.Error):
            ferry.Engine(key=fresh_key("log"), transports=["ucx"], listen_port=port)


def test_set_and_get_level():
    before = ferry.get_log_level()
    try:
        for name in ("trace", "debug", "info", "warn", "error", "off"):
            ferry.set_log_level(name)
            assert ferry.get_log_level() == name
        ferry.set_log_level("WARNING")
        assert ferry.get_log_level() == "warn"
        with pytest.raises(ferry.InvalidArgumentError, match="unknown log level"):
            ferry.set_log_level("loud")
        assert ferry.get_log_level() == "warn"
    finally:
        ferry.set_log_level(before)


def test_caplog_receives_ferry_messages(ferry_logging, caplog):
    ferry.set_log_level("info")
    with caplog.at_level(logging.DEBUG, logger="ferry"):
        _refused_ucx_engine()
    records = [r for r in caplog.records if r.name == "ferry" and "transport ucx is not usable" in r.getMessage()]
    assert records, [r.getMessage() for r in caplog.records]
    assert records[0].levelno == logging.INFO


def test_ferry_level_filters_before_python(ferry_logging, caplog):
    ferry.set_log_level("warn")
    with caplog.at_level(logging.DEBUG, logger="ferry"):
        _refused_ucx_engine()
    assert not [r for r in caplog.records if r.name == "ferry"], [r.getMessage() for r in caplog.records]


def test_python_logger_level_filters_too(ferry_logging, caplog):
    ferry.set_log_level("info")
    with caplog.at_level(logging.ERROR, logger="ferry"):
        _refused_ucx_engine()
    assert not [r for r in caplog.records if r.name == "ferry"]


def _run(code, env_extra):
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_ferry_log_is_read_by_the_library():
    done = _run("import ferry; print(ferry.get_log_level())", {"FERRY_LOG": "debug"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "debug"


def test_bad_ferry_log_warns_and_keeps_the_default():
    done = _run("import ferry; print(ferry.get_log_level())", {"FERRY_LOG": "loud"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "warn"
    assert "FERRY_LOG=loud" in done.stderr


def test_messages_from_a_thread_at_exit_do_not_hang():
    # ferry logs from its threads while the interpreter exits; the sink drops them quietly.
    code = (
        "import ferry, logging; logging.basicConfig(level=logging.INFO);"
        "ferry.log_to_python(); ferry.set_log_level('debug');"
        "e = ferry.Engine(); print('ok')"
    )
    done = _run(code, {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
