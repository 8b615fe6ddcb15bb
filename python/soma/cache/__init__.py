"""``python -m soma.cache PATH``: what a cache folder holds, and pruning it.

    python -m soma.cache PATH                      # its entries, newest use first
    python -m soma.cache PATH --older-than 7d      # removes those not used in 7 days
    python -m soma.cache PATH --node load          # removes node `load`'s
    python -m soma.cache PATH --max-bytes 1G       # removes the least recently used past 1 GB
    python -m soma.cache PATH --clear              # removes every entry, and what killed
                                                   # writers left

Each entry is listed with the node that made it, its class, its size, when it was made, when
it was last used and the seconds computing it took (what each hit on it saves). Reads each
entry's record alone, as :class:`soma.Cache` writes it; an entry whose record is not whole is
listed as damaged (a run computes it again anyway). ``--older-than`` and ``--node`` together
remove the entries that match both; ``--max-bytes`` then removes the least recently used of
the rest until they fit. Pruning while other processes use the folder is safe: they miss and
compute again.

The package holds the cache itself: :class:`soma.Cache` in ``_cache`` (the entries, in memory or
in a folder) and what its keys cover in ``_fingerprint`` (the digests of values, code and
nodes), with the two ways a user tells a key what Soma cannot see: ``soma.cache.resource(cls)``
(values of ``cls`` are resources, keyed by their type) and ``soma.cache.ignore(value)`` (a value
no key reads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from soma.cache._cache import _read_head, _Record
from soma.cache._fingerprint import ignore, resource

__all__ = ["ignore", "resource"]

_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_BYTES = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def duration(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` as seconds."""
    number, unit = text[:-1], text[-1:].lower()
    try:
        if unit not in _SECONDS:
            raise ValueError
        seconds = float(number) * _SECONDS[unit]
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (say 7d, 12h, 30m, 90s or 2w)") from None
    if not seconds >= 0:
        raise ValueError(f"not a duration: {text!r} (say 7d, 12h, 30m, 90s or 2w)")
    return seconds


def byte_count(text: str) -> int:
    """``1G``, ``500M``, ``20k``, ``1.5GB``, ``4096`` as bytes (powers of 1000)."""
    lowered = text.strip().lower().removesuffix("b")
    unit = lowered[-1:] if lowered[-1:] in _BYTES else ""
    try:
        count = float(lowered[: len(lowered) - len(unit)]) * _BYTES[unit]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (say 1G, 500M, 20k or 4096)") from None
    if not count >= 0:
        raise ValueError(f"not a size: {text!r} (say 1G, 500M, 20k or 4096)")
    return int(count)


@dataclasses.dataclass(frozen=True)
class Listed:
    """An entry as the command sees it: its file, size, last use, and its record (``None``
    when it is damaged)."""

    file: Path
    size: int
    used: float
    record: _Record | None


def entries(folder: Path) -> list[Listed]:
    """The folder's entries, newest use first."""
    found = []
    for file in folder.glob("*/*.entry"):
        with contextlib.suppress(OSError):  # Removed meanwhile by another process.
            record, _, size, used = _read_head(str(file))
            found.append(Listed(file, size, used, record))
    found.sort(key=lambda entry: entry.used, reverse=True)
    return found


def listing(folder: Path) -> str:
    """The entries of ``folder`` (a folder given to ``soma.Cache(path)``), newest use first,
    under a line with their count and size; an entry that is not whole is listed as damaged."""
    # Imported here: `import soma` imports this package (for `soma.Cache`), not the command.
    import datetime

    def when(seconds: float) -> str:
        return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")

    found = entries(folder)
    lines = [f"{folder}: {len(found)} entries, {_size(sum(e.size for e in found))}"]
    rows = [("node", "class", "size", "made", "used", "saves")]
    for entry in found:
        record = entry.record
        if record is None:
            rows.append(("(damaged)", "", _size(entry.size), "", when(entry.used), ""))
        else:
            saves = f"{record.seconds:.3f} s"
            made = when(record.made)
            rows.append((record.node, record.cls, _size(entry.size), made, when(entry.used), saves))
    if found:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            cells = [
                cell.rjust(width) if i in (2, 5) else cell.ljust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  " + "  ".join(cells).rstrip())
    return "\n".join(lines)


def prune(
    folder: Path,
    *,
    older_than: float | None = None,
    node: str | None = None,
    max_bytes: int | None = None,
    now: float | None = None,
) -> tuple[int, int]:
    """Removes the entries not used for ``older_than`` seconds and made by ``node`` (each when
    given; both when both are), then the least recently used of the rest until they hold
    ``max_bytes`` at most. Returns how many it removed and the bytes they held."""
    import time

    now = time.time() if now is None else now
    kept = []
    removed = freed = 0

    def remove(entry: Listed) -> None:
        nonlocal removed, freed
        with contextlib.suppress(OSError):  # Removed meanwhile by another process.
            entry.file.unlink()
            removed += 1
            freed += entry.size

    filtered = older_than is not None or node is not None
    for entry in entries(folder):
        old = older_than is None or now - entry.used > older_than
        ours = node is None or (entry.record is not None and entry.record.node == node)
        if filtered and old and ours:
            remove(entry)
        else:
            kept.append(entry)
    if max_bytes is not None:
        held = sum(entry.size for entry in kept)
        for entry in reversed(kept):  # The least recently used first.
            if held <= max_bytes:
                break
            held -= entry.size
            remove(entry)
    return removed, freed


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
    """``python -m soma.cache PATH [--older-than AGE] [--node ID] [--max-bytes SIZE] [--clear]``:
    lists the folder's entries, prunes them, or clears them.

    Args:
        argv: the command's arguments; ``None`` (the default) reads ``sys.argv``.

    Returns:
        The exit status: 0, or 1 when ``PATH`` is not a folder (said on stderr).
    """
    import argparse  # Imported here, as `datetime` is in `listing`.

    def argument(parse: Callable[[str], object]) -> Callable[[str], object]:
        def parsed(text: str) -> object:
            try:
                return parse(text)
            except ValueError as error:  # Said as it is, not as "invalid value".
                raise argparse.ArgumentTypeError(str(error)) from None

        parsed.__name__ = parse.__name__
        return parsed

    parser = argparse.ArgumentParser(
        prog="python -m soma.cache",
        description="List the entries of a soma.Cache folder, or prune them.",
        epilog=__doc__.split("\n\n")[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", type=Path, help="a folder given to soma.Cache(path)")
    parser.add_argument(
        "--older-than",
        type=argument(duration),
        metavar="AGE",
        help="remove the entries not used for AGE (7d, 12h, 30m, 90s, 2w)",
    )
    parser.add_argument("--node", metavar="ID", help="remove the entries node ID made")
    parser.add_argument(
        "--max-bytes",
        type=argument(byte_count),
        metavar="SIZE",
        help="remove the least recently used entries until the rest hold SIZE (1G, 500M, 20k)",
    )
    parser.add_argument("--clear", action="store_true", help="remove every entry")
    options = parser.parse_args(argv)
    folder: Path = options.path
    if not folder.is_dir():
        print(f"no cache folder at `{folder}`", file=sys.stderr)
        return 1
    pruning = (options.older_than, options.node, options.max_bytes) != (None, None, None)
    if options.clear and pruning:
        parser.error("--clear removes every entry: give it alone")
    if options.clear:
        print(f"{folder}: removed {clear(folder)} files")
    elif pruning:
        removed, freed = prune(
            folder,
            older_than=options.older_than,
            node=options.node,
            max_bytes=options.max_bytes,
        )
        left = entries(folder)
        print(
            f"{folder}: removed {removed} entries ({_size(freed)}); "
            f"{len(left)} left ({_size(sum(entry.size for entry in left))})"
        )
    else:
        print(listing(folder))
    return 0
