"""``python -m soma.cache PATH``: what a cache folder holds, and clearing it.

    python -m soma.cache PATH           # its entries, newest use first, and their total size
    python -m soma.cache PATH --clear   # removes every entry, and what killed writers left

Reads the folder as :class:`soma.Cache` writes it; an entry that is not whole is listed as
damaged (a run computes it again anyway). Clearing while other processes use the folder is
safe: they miss and compute again.

The package holds the cache itself: :class:`soma.Cache` in ``_cache`` (the entries, in memory or
in a folder) and what its keys cover in ``_fingerprint`` (the digests of values, code and
nodes), with the two ways a user tells a key what Soma cannot see: ``soma.cache.resource(cls)``
(values of ``cls`` are resources, keyed by their type) and ``soma.cache.ignore(value)`` (a value
no key reads).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from soma.cache._cache import _read_entry
from soma.cache._fingerprint import ignore, resource

__all__ = ["ignore", "resource"]


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def listing(folder: Path) -> str:
    """The entries of ``folder`` (a folder given to ``soma.Cache(path)``), newest use first,
    under a line with their count and size; an entry that is not whole is listed as damaged."""
    # Imported here: `import soma` imports this package (for `soma.Cache`), not the command.
    import datetime

    rows = []
    total = 0
    for file in folder.glob("*/*.entry"):
        with contextlib.suppress(OSError):  # Removed meanwhile by another process.
            status = file.stat()
            read = _read_entry(file.read_bytes())
            total += status.st_size
            rows.append((status.st_mtime, file.stem, status.st_size, read))
    rows.sort(reverse=True)
    lines = [f"{folder}: {len(rows)} entries, {_size(total)}"]
    for used, key, size, read in rows:
        when = datetime.datetime.fromtimestamp(used).strftime("%Y-%m-%d %H:%M:%S")
        what = "damaged" if read is None else f"computed in {read.seconds:.3f} s"
        lines.append(f"  {key[:16]}  {_size(size):>9}  used {when}  {what}")
    return "\n".join(lines)


def clear(folder: Path) -> int:
    """Removes every entry of ``folder`` and the temporary files killed writers left; returns
    how many files it removed. A file another process removes meanwhile is skipped."""
    removed = 0
    for pattern in ("*/*.entry", "*/.*.tmp", ".*.tmp"):
        for file in folder.glob(pattern):
            with contextlib.suppress(OSError):
                file.unlink()
                removed += 1
    return removed


def main(argv: list[str] | None = None) -> int:
    """``python -m soma.cache PATH [--clear]``: prints the folder's entries, or clears them.

    Args:
        argv: the command's arguments; ``None`` (the default) reads ``sys.argv``.

    Returns:
        The exit status: 0, or 1 when ``PATH`` is not a folder (said on stderr).
    """
    import argparse  # Imported here, as `datetime` is in `listing`.

    parser = argparse.ArgumentParser(prog="python -m soma.cache", description=__doc__)
    parser.add_argument("path", type=Path, help="a folder given to soma.Cache(path)")
    parser.add_argument("--clear", action="store_true", help="remove every entry")
    options = parser.parse_args(argv)
    folder: Path = options.path
    if not folder.is_dir():
        print(f"no cache folder at `{folder}`", file=sys.stderr)
        return 1
    if options.clear:
        print(f"{folder}: removed {clear(folder)} files")
    else:
        print(listing(folder))
    return 0
