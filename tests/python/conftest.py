"""Fixtures for ferry's Python suite.

Run from a build tree: ``PYTHONPATH=<build>/python python3 -m pytest tests/python`` (CTest's
``python_tests`` does so).
"""

import pytest

try:
    import ferry
except ImportError as e:  # pragma: no cover - a setup error, not a test failure
    raise pytest.UsageError(
        f"cannot import ferry ({e}); build it and set PYTHONPATH=<build>/python"
    ) from e

from util import TRANSPORTS, Pair, fresh_key


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    """Each transport usable here, in turn (the conformance suite's parametrisation)."""
    return request.param


@pytest.fixture
def make_pair(transport):
    """make_pair(size, **engine_options) -> a Pair over the parametrised transport."""
    made = []

    def make(size: int, **options) -> Pair:
        pair = Pair.make(transport, size, **options)
        assert pair.session.path.transport == transport
        made.append(pair)
        return pair

    yield make
    for pair in made:
        pair.close()


@pytest.fixture
def engine():
    """One engine with every usable transport, closed after the test."""
    with ferry.Engine(key=fresh_key("solo")) as e:
        yield e
