"""Engine() reads the FERRY_* variables (EngineOptions::FromEnv); keyword arguments win."""

import pytest

import ferry
from util import fresh_key


def test_env_sets_an_option(monkeypatch):
    key = fresh_key("env")
    monkeypatch.setenv("FERRY_KEY", key)
    monkeypatch.setenv("FERRY_TRANSPORTS", "local")
    with ferry.Engine() as e:
        assert e.key == key


def test_keyword_beats_env(monkeypatch):
    monkeypatch.setenv("FERRY_KEY", fresh_key("env"))
    key = fresh_key("kw")
    with ferry.Engine(key=key, transports=["local"]) as e:
        assert e.key == key


def test_env_kwargs_cover_engine_options(monkeypatch):
    monkeypatch.setenv("FERRY_UCX_LANES", "3")
    monkeypatch.setenv("FERRY_DEFAULT_DEADLINE", "2s")
    monkeypatch.setenv("FERRY_PARALLEL_COPY_BYTES", "1M")
    monkeypatch.setenv("FERRY_UCX_PROGRESS", "polling")
    k = ferry._ferry._env_engine_kwargs()
    assert k["lanes"] == 3
    assert k["default_deadline_ms"] == 2000.0
    assert k["parallel_copy_bytes"] == 1 << 20
    assert k["progress"] == "polling"


@pytest.mark.parametrize(
    "name,value",
    [("FERRY_COPY_THREADS", "many"), ("FERRY_PIN_HOST_MEMORY", "yes"), ("FERRY_UCX_LISTEN_PORT", "70000")],
)
def test_bad_env_value_names_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ferry.InvalidArgumentError, match=name):
        ferry.Engine(transports=["local"])
