"""``python -m soma.cache PATH``: a folder's entries listed by the node that made them, and
pruned by age, node and size, on a real folder a run wrote.

Each entry records its node's id, its class, when it was made and the seconds computing it
took, in the record written with it (renamed into place with it); when it was last used is its
file's modification time, which a hit moves.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import soma
from conftest import SUBPROCESS_DEADLINE, CallRecord
from soma.cache import byte_count, duration, entries, prune

CALLS = CallRecord()


class Load(soma.Node):
    def forward(self, n: int) -> list[int]:
        CALLS.append("load")
        return list(range(n))


class Total(soma.Node):
    def forward(self, xs: list[int]) -> int:
        CALLS.append("total")
        return sum(xs)


def filled(folder: Path, *inputs: int) -> soma.Cache:
    """A folder cache after a run of `load >> total` on each of ``inputs``."""
    cache = soma.Cache(folder)
    g = soma.Graph.somatize(Load().named("load") >> Total().named("total"))
    for n in inputs:
        g.forward(n, cache=cache)
    return cache


def command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "soma.cache", *args],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_DEADLINE,
    )


def aged(folder: Path, node: str, seconds: float) -> None:
    """Marks ``node``'s entries last used ``seconds`` ago."""
    for entry in entries(folder):
        if entry.record is not None and entry.record.node == node:
            then = time.time() - seconds
            os.utime(entry.file, (then, then))


def test_the_listing_names_each_entrys_node_class_size_when_made_and_used_and_its_seconds(
    tmp_path: Path,
) -> None:
    before = time.time()
    filled(tmp_path, 1000)
    shown = command(str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    head, header, *rows = shown.stdout.splitlines()
    assert head.startswith(f"{tmp_path}: 2 entries, ")
    assert header.split() == ["node", "class", "size", "made", "used", "saves"]
    assert sorted(row.split()[:2] for row in rows) == [
        ["load", "test_cache_command.Load"],
        ["total", "test_cache_command.Total"],
    ]
    for entry in entries(tmp_path):
        assert entry.record is not None
        assert before - 1 <= entry.record.made <= time.time() + 1
        assert entry.record.seconds > 0
        assert entry.size == entry.file.stat().st_size
    assert all(row.rstrip().endswith(" s") for row in rows)


def test_the_listing_puts_the_newest_use_first_and_marks_a_damaged_entry(tmp_path: Path) -> None:
    filled(tmp_path, 10, 20)
    aged(tmp_path, "load", 3_600 * 5)
    damaged = next(e.file for e in entries(tmp_path) if e.record and e.record.node == "total")
    damaged.write_bytes(damaged.read_bytes()[:60])
    *_, rows = command(str(tmp_path)).stdout.partition("saves\n")
    nodes = [row.split()[0] for row in rows.splitlines()]
    assert nodes[0] in ("total", "(damaged)")
    assert nodes.count("(damaged)") == 1
    assert nodes[-2:] == ["load", "load"]


def test_older_than_removes_the_entries_not_used_for_that_long_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    filled(tmp_path, 10)
    aged(tmp_path, "load", 8 * 86_400)
    done = command(str(tmp_path), "--older-than", "7d")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{tmp_path}: removed 1 entries (")
    assert [e.record.node for e in entries(tmp_path) if e.record] == ["total"]


def test_a_hit_marks_its_entry_used_so_older_than_keeps_what_a_rerun_reads(
    tmp_path: Path,
) -> None:
    cache = filled(tmp_path, 10)
    aged(tmp_path, "load", 8 * 86_400)
    aged(tmp_path, "total", 8 * 86_400)
    CALLS.clear()
    soma.Graph.somatize(Load().named("load") >> Total().named("total")).forward(10, cache=cache)
    assert CALLS == []  # Both hit, `load`'s output unread: its record was.
    assert prune(tmp_path, older_than=86_400) == (0, 0)
    assert len(entries(tmp_path)) == 2


def test_node_removes_that_nodes_entries_and_with_older_than_only_its_old_ones(
    tmp_path: Path,
) -> None:
    filled(tmp_path, 10, 20, 30)
    newest = max(
        (e for e in entries(tmp_path) if e.record and e.record.node == "load"),
        key=lambda e: e.record.made if e.record else 0,
    )
    aged(tmp_path, "load", 3 * 86_400)
    os.utime(newest.file)  # One of `load`'s used now.
    assert command(str(tmp_path), "--node", "load", "--older-than", "2d").returncode == 0
    left = sorted(e.record.node for e in entries(tmp_path) if e.record)
    assert left == ["load", "total", "total", "total"]
    assert command(str(tmp_path), "--node", "load").returncode == 0
    assert sorted(e.record.node for e in entries(tmp_path) if e.record) == ["total"] * 3
    # A rerun computes `load` again, and finds `total`'s entries.
    CALLS.clear()
    g = soma.Graph.somatize(Load().named("load") >> Total().named("total"))
    assert g.forward(20, cache=soma.Cache(tmp_path)) == 190
    assert CALLS == ["load"]


def test_max_bytes_removes_the_least_recently_used_until_the_rest_fit(tmp_path: Path) -> None:
    filled(tmp_path, 1000, 2000, 3000)
    listed = entries(tmp_path)
    for age, entry in enumerate(listed):  # Spread their uses apart, in the order listed.
        then = time.time() - 60 * age
        os.utime(entry.file, (then, then))
    bound = sum(entry.size for entry in listed[:3])
    done = command(str(tmp_path), "--max-bytes", str(bound))
    assert done.returncode == 0, done.stderr
    assert [e.file for e in entries(tmp_path)] == [e.file for e in listed[:3]]
    assert command(str(tmp_path), "--max-bytes", "0").returncode == 0
    assert entries(tmp_path) == []


def test_help_is_a_usage_message_naming_every_option(tmp_path: Path) -> None:
    shown = command("--help")
    assert shown.returncode == 0
    assert shown.stdout.startswith("usage: python -m soma.cache ")
    for option in ("--older-than AGE", "--node ID", "--max-bytes SIZE", "--clear"):
        assert option in shown.stdout


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--older-than", "7x", "not a duration: '7x'"),
        ("--older-than", "-1d", "not a duration"),
        ("--max-bytes", "lots", "not a size: 'lots'"),
    ],
)
def test_an_age_or_a_size_it_cannot_read_is_refused_saying_how_to_write_one(
    tmp_path: Path, option: str, value: str, said: str
) -> None:
    filled(tmp_path, 10)
    refused = command(str(tmp_path), f"{option}={value}")
    assert refused.returncode == 2
    assert said in refused.stderr
    assert len(entries(tmp_path)) == 2


def test_clear_with_a_pruning_option_is_refused() -> None:
    refused = command("/tmp", "--clear", "--node", "x")
    assert refused.returncode == 2
    assert "--clear removes every entry" in refused.stderr


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("7d", 7 * 86_400), ("12h", 43_200), ("30m", 1_800), ("90s", 90), ("2w", 14 * 86_400)],
)
def test_ages_are_read_in_seconds_minutes_hours_days_and_weeks(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "count"),
    [("1G", 10**9), ("500M", 5 * 10**8), ("20k", 20_000), ("1.5GB", 15 * 10**8), ("4096", 4096)],
)
def test_sizes_are_read_in_bytes_with_decimal_units(text: str, count: Any) -> None:
    assert byte_count(text) == count
