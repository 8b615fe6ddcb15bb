"""Text columns are keyed at native speed and by their whole content.

A numpy array of objects holding text — a pandas ``object`` or ``str`` column — is digested
from its pointers in Rust (``soma._soma.text_column``), each string tagged and its length
before it; anything else in it (an int, a lone surrogate, an object of the user's) is walked
element by element as before. Either way two columns of different content never share a key.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import soma
from conftest import CallRecord
from soma import _soma
from soma.cache import _fingerprint


def digest(value: object) -> bytes:
    return _fingerprint.digest(value)


def column(items: list[Any]) -> np.ndarray[Any, Any]:
    """A one-dimensional object array holding ``items`` as they are (never split further)."""
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


class Word:
    """An object of the user's in a column: walked by what pickle keeps of it."""

    def __init__(self, text: str) -> None:
        self.text = text


# What a text column holds: strings of any characters (NULs and lone surrogates among them),
# the missing values pandas puts there, and now and then what is not text.
elements = st.one_of(
    st.text(),
    st.text(alphabet=st.sampled_from(["a", "s", "N", "f", "\x00", "é", "\ud800", "😀"])),
    st.none(),
    st.floats(allow_nan=True),
    st.integers(),
    st.binary(max_size=4),
    st.builds(Word, st.text(max_size=3)),
)


def same_content(first: list[Any], second: list[Any]) -> bool:
    def key(item: Any) -> Any:
        if isinstance(item, float):
            return ("float", np.float64(item).tobytes())  # NaN equal to itself, -0.0 not 0.0
        return (type(item).__name__, item.text if isinstance(item, Word) else item)

    return [key(item) for item in first] == [key(item) for item in second]


@settings(max_examples=400)
@given(first=st.lists(elements, max_size=6), second=st.lists(elements, max_size=6))
def test_two_object_columns_share_a_key_exactly_when_they_hold_the_same_content(
    first: list[Any], second: list[Any]
) -> None:
    assert digest(column(first)) == digest(column(list(first)))
    assert (digest(column(first)) == digest(column(second))) == same_content(first, second)


@settings(max_examples=200)
@given(parts=st.lists(st.text(max_size=4), min_size=1, max_size=5), at=st.integers(0, 20))
def test_the_same_characters_split_into_other_strings_are_another_key(
    parts: list[str], at: int
) -> None:
    whole = "".join(parts)
    at = at % (len(whole) + 1)
    resplit = [whole[:at], whole[at:]]
    assert (digest(column(parts)) == digest(column(resplit))) == (parts == resplit)


def test_splits_nuls_and_a_non_str_object_each_change_a_columns_key() -> None:
    keys = {
        digest(column(["ab", "c"])),
        digest(column(["a", "bc"])),
        digest(column(["abc"])),
        digest(column(["a\x00", "b"])),
        digest(column(["a", "\x00b"])),
        digest(column(["a\x00b"])),
        digest(column(["a", 1])),
        digest(column(["a", "1"])),
        digest(column(["a", None])),
        digest(column(["a", "None"])),
        digest(column(["a", float("nan")])),
        digest(column(["a", b"a"])),
        digest(column(["a", Word("a")])),
    }
    assert len(keys) == 13


def test_a_text_column_is_read_in_rust_and_a_column_with_other_objects_is_walked() -> None:
    assert _soma.text_column(column(["a", None, 1.5, "é\x00"])) is not None
    assert _soma.text_column(column(["a", 1])) is None  # an int: walked instead
    assert _soma.text_column(column(["\ud800"])) is None  # no UTF-8 form: walked instead
    assert _soma.text_column(column(["a", "b", "c"])[::2]) is None  # not contiguous: copied first
    assert _soma.text_column(np.array([["a"]], dtype=object)) is None  # flattened first
    assert _soma.text_column(np.array(["a", "b"])) is None  # `U`: read as a buffer instead
    assert _soma.text_column(["a", "b"]) is None  # not an array at all


def test_a_subclass_of_str_in_a_column_is_keyed_with_its_class() -> None:
    class Name(str):
        pass

    assert digest(column(["a", Name("b")])) != digest(column(["a", "b"]))


def test_a_column_is_keyed_the_same_contiguous_strided_or_in_two_dimensions() -> None:
    data = column(["x", "yy", None, "zzz"])
    strided = column(["x", "-", "yy", "-", None, "-", "zzz", "-"])[::2]
    assert digest(strided) == digest(data)
    assert digest(data.reshape(2, 2)) != digest(data)  # its shape is in its key


@pytest.mark.parametrize(
    "dtype", ["object", "str", "string[python]", "category"], ids=lambda d: f"dtype={d}"
)
def test_a_frame_with_a_text_column_is_keyed_by_every_string_in_it(dtype: str) -> None:
    rows = [f"item-{i % 7}" for i in range(1000)]
    frame = pd.DataFrame({"x": np.arange(1000), "s": pd.Series(rows, dtype=dtype)})
    again = pd.DataFrame({"x": np.arange(1000), "s": pd.Series(list(rows), dtype=dtype)})
    edited = rows.copy()
    edited[500] = "item-x"
    other = pd.DataFrame({"x": np.arange(1000), "s": pd.Series(edited, dtype=dtype)})
    assert digest(frame) == digest(again)
    assert digest(frame) != digest(other)


def test_numpy_unicode_and_bytes_arrays_are_keyed_by_their_characters_and_width() -> None:
    assert digest(np.array(["ab", "c"])) == digest(np.array(["ab", "c"]))
    assert digest(np.array(["ab", "c"])) != digest(np.array(["a", "bc"]))
    assert digest(np.array(["a"], dtype="U1")) != digest(np.array(["a"], dtype="U2"))
    assert digest(np.array(["ab"])) != digest(np.array([b"ab"]))


def test_a_node_reading_a_text_column_hits_and_an_edited_string_runs_it_again(
    tmp_path: Any,
) -> None:
    calls = CallRecord()

    class Length(soma.Node):
        def forward(self, frame: pd.DataFrame) -> int:
            calls.append(1)
            return int(frame["s"].str.len().sum())

    g = soma.Graph.somatize(Length())
    cache = soma.Cache(tmp_path / "cache")
    frame = pd.DataFrame({"s": ["a", "bb", "ccc"] * 100})
    assert g.forward(frame, cache=cache) == 600
    assert g.forward(frame.copy(), cache=cache) == 600
    assert len(calls) == 1
    frame.loc[0, "s"] = "aa"
    assert g.forward(frame, cache=cache) == 601
    assert len(calls) == 2
