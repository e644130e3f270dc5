"""EngineDesc and MemoryDesc: fields, pack/unpack round trips, rejection of bad bytes."""

import pickle

import numpy as np
import pytest

import ferry


@pytest.fixture
def described(engine):
    buf = np.zeros(4096, np.uint8)
    return engine, buf, engine.register_memory(buf)


def test_engine_desc_fields_and_round_trip(engine):
    desc = engine.describe()
    assert desc.key == engine.key
    assert desc.protocol_version == ferry.PROTOCOL_VERSION
    assert desc.pid > 0
    assert desc.host_id
    assert [name for name, _ in desc.transports] == engine.transports
    assert all(isinstance(data, bytes) for _, data in desc.transports)
    assert isinstance(desc.addresses, list)

    packed = desc.pack()
    assert isinstance(packed, bytes)
    assert len(packed) <= ferry.MAX_DESCRIPTOR_BYTES
    back = ferry.EngineDesc.unpack(packed)
    assert back == desc
    assert back.pack() == packed
    assert (back.key, back.pid, back.host_id) == (desc.key, desc.pid, desc.host_id)


def test_memory_desc_fields_and_round_trip(described):
    engine, buf, desc = described
    assert desc.engine_key == engine.key
    assert desc.address == buf.ctypes.data
    assert desc.size == buf.nbytes
    assert desc.kind == "host"
    assert desc.device == -1
    assert desc.host_id == engine.describe().host_id
    assert desc.region > 0
    assert desc.access, "at least one transport reaches the region"

    back = ferry.MemoryDesc.unpack(desc.pack())
    assert back == desc
    assert (back.region, back.address, back.size) == (desc.region, desc.address, desc.size)
    assert back.access == desc.access


def test_unpack_takes_any_bytes_like(described):
    _, _, desc = described
    packed = desc.pack()
    for form in (bytearray(packed), memoryview(packed), np.frombuffer(packed, np.uint8)):
        assert ferry.MemoryDesc.unpack(form) == desc


def test_unpack_rejects_non_bytes_with_type_error():
    with pytest.raises(TypeError):
        ferry.EngineDesc.unpack("not bytes")
    with pytest.raises(TypeError):
        ferry.MemoryDesc.unpack(12)


def test_descriptors_pickle(described):
    engine, _, desc = described
    assert pickle.loads(pickle.dumps(desc)) == desc
    assert pickle.loads(pickle.dumps(engine.describe())) == engine.describe()


@pytest.mark.parametrize("which", ["engine", "memory"])
def test_every_truncation_is_rejected(described, which):
    engine, _, mem = described
    cls, packed = (
        (ferry.EngineDesc, engine.describe().pack())
        if which == "engine"
        else (ferry.MemoryDesc, mem.pack())
    )
    for n in range(len(packed)):
        with pytest.raises(ferry.Error) as info:
            cls.unpack(packed[:n])
        assert info.value.code == "INVALID_ARGUMENT", (n, str(info.value))


@pytest.mark.parametrize("cls", [ferry.EngineDesc, ferry.MemoryDesc])
def test_garbage_is_rejected(cls):
    rng = np.random.default_rng(7)
    for i in range(300):
        garbage = rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8).tobytes()
        try:
            cls.unpack(garbage)
        except ferry.Error as e:
            assert e.code == "INVALID_ARGUMENT", (i, str(e))
    for garbage in (b"", b"\x00", b"\xc1" * 64, b"\xff" * 4096, b"\x92\x01"):
        with pytest.raises(ferry.Error) as info:
            cls.unpack(garbage)
        assert info.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize("cls", [ferry.EngineDesc, ferry.MemoryDesc])
def test_oversized_input_is_rejected(cls):
    with pytest.raises(ferry.Error) as info:
        cls.unpack(b"\x90" * (ferry.MAX_DESCRIPTOR_BYTES + 1))
    assert info.value.code == "INVALID_ARGUMENT"


def test_trailing_bytes_and_bit_flips_never_crash(described):
    engine, _, mem = described
    for cls, packed in ((ferry.EngineDesc, engine.describe().pack()), (ferry.MemoryDesc, mem.pack())):
        with pytest.raises(ferry.Error):
            cls.unpack(packed + b"\x00")
        for i in range(len(packed)):
            for bit in (0x01, 0x80):
                flipped = bytearray(packed)
                flipped[i] ^= bit
                try:
                    cls.unpack(bytes(flipped))
                except ferry.Error as e:
                    assert e.code in ferry.CODES


@pytest.mark.parametrize("which", ["engine", "memory"])
def test_other_protocol_versions_are_refused(described, which):
    engine, _, mem = described
    cls, magic, packed = (
        (ferry.EngineDesc, b"ferry.engine", engine.describe().pack())
        if which == "engine"
        else (ferry.MemoryDesc, b"ferry.mem", mem.pack())
    )
    # The encoding starts with the magic string, then the version as a msgpack fixint.
    at = packed.find(magic) + len(magic)
    assert packed[at] == ferry.PROTOCOL_VERSION
    other = packed[:at] + bytes([ferry.PROTOCOL_VERSION + 1]) + packed[at + 1 :]
    with pytest.raises(ferry.Error) as info:
        cls.unpack(other)
    assert info.value.code == "INVALID_ARGUMENT"
    assert "version" in info.value.message
