"""The one-value encoding of a masking message (:func:`mechanisms.secagg.masking.messages.encode_message`):
exact round trips, and untrusted bytes that are not a message end in one TypeError (the node's
malformed-request refusal), never another error, a read past the end or an allocation the bytes ask for."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mechanisms.secagg.masking.messages import MESSAGE_MAGIC, decode_message, encode_message

MSG = {
    "stage": "unmask",
    "session": os.urandom(16),
    "K": 1000,
    "neg": -(2**63),
    "top": 2**63 - 1,
    "x": 0.25,
    "flag": True,
    "uploaded": [0, 5, 999],
    "wide_ids": [0, 2**16, -3],
    "empties": [b"", b""],
    "sigs": [os.urandom(64) for _ in range(3)],
    "views": [b"", os.urandom(7), os.urandom(90)],
    "kind": ["b", "s", "é"],
    "floats": [1.5, -0.0, float("inf")],
    "flags": [False, True],
    "to": [],
    "blank": b"",
    "text": "",
}


def test_every_type_comes_back_equal_and_of_its_type():
    back = decode_message(encode_message(MSG))
    assert list(back) == list(MSG)
    for k, v in MSG.items():
        assert back[k] == v and type(back[k]) is type(v), k
        if isinstance(v, list):
            assert [type(x) for x in back[k]] == [type(x) for x in v], k
    assert np.signbit(back["floats"][1])  # -0.0 stays -0.0
    # node ids two bytes each, equal-width bytes (keys, signatures) without a length each
    ids = encode_message({"ids": list(range(21))})
    sigs = encode_message({"sigs": [bytes(64)] * 21})
    assert len(ids) == 6 + 5 + 4 + 2 * 21 and len(sigs) == 6 + 6 + 8 + 64 * 21


@pytest.mark.parametrize(
    "value",
    [None, [1, b"x"], [True, 1], 2**63, [2**63], np.int64(3), bytearray(b"x"), {"a": 1}, [[1]], 1j],
)
def test_what_has_no_encoding_is_a_type_error(value):
    with pytest.raises(TypeError, match="message field 'v'"):
        encode_message({"v": value})
    with pytest.raises(TypeError, match="field name"):
        encode_message({"": 1})


def _field(name: bytes, tag: bytes, body: bytes, count: int = 1) -> bytes:
    return MESSAGE_MAGIC + struct.pack("<H", count) + bytes((len(name),)) + name + tag + body


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"", "bad header"),
        (b"PFM0\x00\x00", "bad header"),
        (MESSAGE_MAGIC + struct.pack("<H", 1), "fewer fields"),
        (_field(b"k", b"i", b"\x00" * 7), "runs past its end"),
        (_field(b"k", b"b", struct.pack("<I", 2**31) + b"xy"), "runs past its end"),
        (_field(b"k", b"I", struct.pack("<I", 2**29)), "runs past its end"),
        (_field(b"k", b"B", struct.pack("<I", 2**30)), "runs past its end"),
        (_field(b"k", b"B", struct.pack("<II", 1, 2**31) + b"ab"), "runs past its end"),
        (_field(b"k", b"E", struct.pack("<II", 2**32 - 1, 0)), "no width"),
        (_field(b"k", b"E", struct.pack("<II", 2**20, 64) + bytes(64)), "runs past its end"),
        (_field(b"k", b"E", struct.pack("<I", 1)), "runs past its end"),
        (_field(b"k", b"H", struct.pack("<I", 2**31) + bytes(4)), "runs past its end"),
        (_field(b"k", b"T", struct.pack("<I", 2**31)), "not a list of bools"),
        (_field(b"k", b"s", struct.pack("<I", 1) + b"\xff"), "not UTF-8"),
        (_field(b"k", b"S", struct.pack("<II", 1, 1) + b"\xff"), "not UTF-8"),
        (_field(b"k", b"t", b"\x02"), "not a bool"),
        (_field(b"k", b"T", struct.pack("<I", 2) + b"\x01\x07"), "not a list of bools"),
        (_field(b"k", b"?", struct.pack("<I", 0)), "unknown type tag"),
        (_field(b"\xff", b"i", bytes(8)), "not ASCII"),
        (_field(b"", b"i", bytes(8)), "empty or repeated"),
        (_field(b"k", b"i", bytes(8), count=2) + b"\x01ki" + bytes(8), "repeated"),
        (_field(b"k", b"i", bytes(8)) + b"\x00", "after its last field"),
        (_field(b"k" * 255, b"i", b""), "runs past its end"),
    ],
)
def test_malformed_bytes_are_one_type_error_naming_the_fault(raw, why):
    with pytest.raises(TypeError, match=why):
        decode_message(raw)


def test_a_message_of_another_type_is_refused():
    for raw in (None, 7, "PFM1", memoryview(b"PFM1")):
        with pytest.raises(TypeError, match="not bytes"):
            decode_message(raw)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.data())
def test_any_corruption_of_a_message_is_a_type_error_or_a_message(data):
    """Flip, cut or splice a real message anywhere: decoding gives a message (dict) or a TypeError, never
    another exception."""
    raw = bytearray(encode_message(MSG))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, len(raw)))
        if op == "flip" and at < len(raw):
            raw[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del raw[at : at + data.draw(st.integers(1, 9))]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=9))
    try:
        out = decode_message(bytes(raw))
    except TypeError:
        return
    assert isinstance(out, dict)
