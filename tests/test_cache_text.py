"""Text columns are keyed at native speed and by their whole content, and kept compactly.

A numpy array of objects holding text — a pandas ``object`` or ``str`` column — is digested
from its pointers in Rust (``soma._soma.text_column``), each string's length before it, a large
column in blocks on a few threads; anything else in it (an int, a lone surrogate, an object of
the user's) is walked element by element as before. Either way two columns of different
content never share a key. A cache entry keeps such a column packed (``soma._soma.text_pack``):
its distinct strings once each and an index per row, read back as the same column. An Arrow
text column (pandas' ``string[pyarrow]``, ``str`` where pyarrow is installed, pyarrow's own
arrays) is digested from its buffers in Rust (``soma._soma.arrow_text``) and kept as its buffers.
"""

from __future__ import annotations

import copyreg
import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import soma
from conftest import CallRecord, run_script
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


def test_strings_of_every_length_around_a_one_byte_header_are_told_apart() -> None:
    keys = set()
    for n in range(1, 200):
        keys.add(digest(column(["a" * n])))
        keys.add(digest(column(["a", "a" * (n - 1)])))
        keys.add(digest(column(["é" * n])))
    assert len(keys) == 3 * 199


def test_a_text_column_is_read_in_rust_and_a_column_with_other_objects_is_walked() -> None:
    assert _soma.text_column(column(["a", None, 1.5, "é\x00"])) is not None
    assert _soma.text_column(column(["a", 1])) is None  # an int: walked instead
    assert _soma.text_column(column(["\ud800"])) is None  # no UTF-8 form: walked instead
    assert _soma.text_column(column(["a", "b", "c"])[::2]) is None  # not contiguous: copied first
    assert _soma.text_column(np.array([["a"]], dtype=object)) is not None  # any shape, in order
    assert _soma.text_column(np.array(["a", "b"])) is None  # `U`: read as a buffer instead
    assert _soma.text_column(["a", "b"]) is None  # not an array at all
    for odd in (1, "\ud800", Word("x")):  # in a late block of a column read on threads
        long = ["x"] * 70_000
        long[65_000] = odd
        assert _soma.text_column(column(long)) is None
        assert _soma.text_pack(column(long)) is None


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


# Strings of every width CPython keeps (one, two or four bytes a character), a few of each, so
# that a long column repeats them as a real one does.
wide_text = st.one_of(
    st.text(alphabet=st.sampled_from(["a", "b", "7", "-"]), max_size=20),
    st.text(alphabet=st.sampled_from(["é", "ÿ", "a"]), max_size=5),
    st.text(alphabet=st.sampled_from(["ā", "€", "a"]), max_size=5),
    st.text(alphabet=st.sampled_from(["😀", "ā", "a"]), max_size=5),
    st.text(max_size=70),
    st.none(),
    st.floats(allow_nan=True),
)


def fresh(items: list[Any]) -> list[Any]:
    """The same content as ``items``, each string a new object (as read from another file)."""
    return ["".join(list(item)) + "" if isinstance(item, str) else item for item in items]


@settings(max_examples=40, deadline=None)
@given(
    palette=st.lists(wide_text, min_size=1, max_size=12),
    picks=st.lists(st.integers(0, 11), min_size=1, max_size=8),
    length=st.one_of(st.integers(1, 40), st.integers(49_153, 70_000)),  # 4 blocks: threads
    edit=st.integers(0, 69_999),
    other=wide_text,
)
def test_a_long_column_read_in_blocks_on_threads_is_keyed_by_every_element(
    palette: list[Any], picks: list[int], length: int, edit: int, other: Any
) -> None:
    items = [palette[picks[i % len(picks)] % len(palette)] for i in range(length)]
    base = column(items)
    assert digest(base) == digest(column(fresh(items)))
    edited = list(items)
    edited[edit % length] = other
    assert (digest(column(edited)) == digest(base)) == same_content(edited, items)
    assert digest(column([*items, items[-1]])) != digest(base)


@settings(max_examples=100, deadline=None)
@given(items=st.lists(elements, max_size=40), repeat=st.integers(1, 3000))
def test_a_packed_column_reads_back_as_the_same_elements_of_the_same_types(
    items: list[Any], repeat: int
) -> None:
    array = column(items * repeat)
    packed = _soma.text_pack(array)
    if packed is None:  # Not text (an int, an object, a lone surrogate): pickled as it is.
        assert _soma.text_column(array) is None
        return
    back = _soma.text_unpack(packed, array.shape)
    assert back.dtype == object
    assert back.shape == array.shape
    assert same_content(list(back), list(array))
    assert digest(back) == digest(array)


def test_a_corrupted_packed_column_raises_rather_than_reading_wrong_elements() -> None:
    packed = _soma.text_pack(column(["a", "bb", None, 1.5] * 10))
    assert packed is not None
    for cut in (3, 10, 25, len(packed) - 1):
        with pytest.raises(ValueError, match="packed text column"):
            _soma.text_unpack(packed[:cut], (40,))
    with pytest.raises(ValueError, match="packed text column"):
        _soma.text_unpack(packed + b"x", (40,))
    with pytest.raises(ValueError, match="packed text column"):
        _soma.text_unpack(packed, (41,))


def test_a_frame_with_a_text_column_is_kept_packed_and_read_back_equal(tmp_path: Any) -> None:
    rows = [f"customer-{i % 50}" for i in range(20_000)]
    # pandas' `str` held as Python strings, as it is where pyarrow is not installed (with
    # pyarrow, `dtype="str"` is Arrow's buffers, which pickle as they are, not packed here).
    python_str = pd.StringDtype("python", na_value=np.nan)
    frame = pd.DataFrame(
        {
            "s": pd.Series(rows, dtype=python_str),
            "o": pd.Series(rows, dtype=object),
            "x": np.arange(20_000),
        }
    )
    cache = soma.Cache(tmp_path / "cache")

    class Same(soma.Node):
        def forward(self, frame: pd.DataFrame) -> pd.DataFrame:
            return frame.copy()

    g = soma.Graph.somatize(Same())
    g.forward(frame, cache=cache)
    assert cache.stats().bytes_written < 250_000  # pickled one by one: over 500 kB
    again = g.forward(frame, cache=cache)
    assert cache.stats().hits == 1
    pd.testing.assert_frame_equal(again, frame)
    assert list(again.dtypes) == list(frame.dtypes)


def test_a_frame_with_arrow_text_columns_is_kept_as_its_buffers_and_read_back_equal(
    tmp_path: Any,
) -> None:
    pa = pytest.importorskip("pyarrow")
    rows = [f"customer-{i % 50}" for i in range(20_000)]
    # pandas' `str` where pyarrow is installed, and `string[pyarrow]`: Arrow's buffers, which
    # pickle as they are (no work a string), and a chunked column read back whole.
    chunked = pa.chunked_array([rows[:7_000], rows[7_000:]], type=pa.large_string())
    frame = pd.DataFrame(
        {
            "s": pd.Series(rows, dtype=pd.StringDtype("pyarrow", na_value=np.nan)),
            "p": pd.Series(pd.arrays.ArrowStringArray(chunked), dtype="string[pyarrow]"),
            "x": np.arange(20_000),
        }
    )
    cache = soma.Cache(tmp_path / "cache")

    class Same(soma.Node):
        def forward(self, frame: pd.DataFrame) -> pd.DataFrame:
            return frame.copy()

    g = soma.Graph.somatize(Same())
    g.forward(frame, cache=cache)
    buffers = sum(frame[name].array._pa_array.nbytes for name in ("s", "p")) + 8 * 20_000
    assert cache.stats().bytes_written < buffers + 10_000
    again = g.forward(frame, cache=cache)
    assert cache.stats().hits == 1
    pd.testing.assert_frame_equal(again, frame)
    assert list(again.dtypes) == list(frame.dtypes)


@pytest.mark.parametrize("rows", ["head", "middle"])
def test_a_slice_of_a_frame_with_arrow_text_is_kept_as_its_own_rows_not_the_whole_buffers(
    tmp_path: Any, rows: str
) -> None:
    pytest.importorskip("pyarrow")
    frame = pd.DataFrame(
        {"s": pd.Series([f"customer-{i:06d}" for i in range(100_000)], dtype="string[pyarrow]")}
    )
    cache = soma.Cache(tmp_path / "cache")

    class Part(soma.Node):
        def forward(self, frame: pd.DataFrame) -> pd.DataFrame:
            # A slice of the column's buffers, as a group of a `groupby` or `head` is: from
            # their start, or from inside them.
            return frame.iloc[:1_000] if rows == "head" else frame.iloc[50_000:51_000]

    g = soma.Graph.somatize(Part())
    part = g.forward(frame, cache=cache)
    assert cache.stats().bytes_written < 60_000  # Its thousand rows; the column's are 2 MB.
    pd.testing.assert_frame_equal(g.forward(frame, cache=cache), part)
    assert cache.stats().hits == 1


def test_a_whole_arrow_text_column_is_pickled_from_its_own_buffers_not_a_copy() -> None:
    pa = pytest.importorskip("pyarrow")
    from soma.cache import _cache

    rows = [f"customer-{i:06d}" for i in range(10_000)]
    for column in (
        pd.arrays.ArrowStringArray(pa.chunked_array([rows], type=pa.large_string())),
        pd.arrays.ArrowStringArray(pa.chunked_array([rows[:10], [None, *rows[10:]]])),
    ):
        # Its buffers hold one offset more than its elements, and a bitmap rounded to a
        # byte: no slice, pickled as it is.
        assert _cache._pandas_arrow_pickled(column)[2]["_pa_array"] is column._pa_array


def test_arrow_buffers_whose_offsets_lie_outside_them_are_refused_not_read() -> None:
    pa = pytest.importorskip("pyarrow")
    offsets = pa.py_buffer(np.array([0, 2, 4_000], dtype=np.int32).tobytes())
    data = pa.py_buffer(b"abcd")
    assert _soma.arrow_text([(None, offsets, data, 0, 2)], False) is None
    assert _soma.arrow_text([(None, offsets, data, 0, 1)], False) is not None
    assert _soma.arrow_text([(None, offsets, data, 1, 2)], False) is None  # past the offsets


def test_an_arrow_array_made_where_a_freed_one_lay_is_digested_afresh() -> None:
    pa = pytest.importorskip("pyarrow")
    seen: dict[bytes, int] = {}
    places = set()
    for i in range(50):
        array = pa.array([f"row-{i}"])
        places.add(id(array))
        found = digest(array)
        assert digest(array) == found  # read again while it lives: the same
        assert seen.setdefault(found, i) == i
        del array
    assert len(places) < 50  # Some were made where one had been: the case asked about.


def test_a_cached_run_on_values_of_no_library_imports_neither_pyarrow_nor_pandas(
    tmp_path: Any,
) -> None:
    pytest.importorskip("pyarrow")  # Installed, so that importing it would be seen.
    run = run_script(
        "import sys, soma\n"
        "@soma.node\n"
        "def f(x):\n    return [x, 'text', b'bytes'] * 30_000\n"
        f"cache = soma.Cache({str(tmp_path)!r})\n"
        "graph = soma.Graph.somatize(f)\n"
        "assert graph.forward(1, cache=cache) == graph.forward(1, cache=cache)\n"
        "assert cache.stats().hits == 1\n"
        "assert 'pyarrow' not in sys.modules, 'pyarrow was imported'\n"
        "assert 'pandas' not in sys.modules, 'pandas was imported'\n"
        "print('ok')\n"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ok\n"


class Refuses:
    """A class pickle refuses unless a reducer is registered for it with ``copyreg``."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __reduce__(self) -> Any:
        raise TypeError("not without its reducer")


def remade(x: int) -> Refuses:
    return Refuses(x)


def test_a_reducer_registered_with_copyreg_after_a_first_entry_is_used_for_the_next() -> None:
    cache = soma.Cache()
    calls = CallRecord()

    class Make(soma.Node):
        def forward(self, x: int) -> Any:
            calls.append(x)
            return Refuses(x) if x else np.array(["a"], dtype=object)

    g = soma.Graph.somatize(Make())
    g.forward(0, cache=cache)  # a first entry, with an array in it
    copyreg.pickle(Refuses, lambda value: (remade, (value.x,)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert g.forward(7, cache=cache).x == 7
            assert g.forward(7, cache=cache).x == 7
    finally:
        del copyreg.dispatch_table[Refuses]
    assert calls == [0, 7]
