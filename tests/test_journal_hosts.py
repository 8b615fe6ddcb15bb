"""Hosts with a journal: a graph with nodes on hosts run with ``run=`` and ``journal=`` records
each slice in the caller when the slice returns — under a key that covers what it reads and its
nodes' code and state — so a resume answers a finished slice from the journal and never sends it
again, runs it again once one of its nodes was edited, and a folder cache given beside the
journal still reaches the hosts. With hosts in this process (the test transport of
``test_hosts.py``); the run on a real Ray cluster is in ``test_ray_hosts.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import soma
from conftest import CallRecord, serving
from test_hosts import _HostsHere

# Which node was called with what, in order: keyed as an empty record (see `CallRecord`).
CALLED = CallRecord()
# While it holds anything, node `last` fails: its key is the same either way.
BROKEN = CallRecord()


class Add(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int, ctx: soma.Ctx) -> int:
        CALLED.append(ctx.node)
        return x + self.k


class Last(soma.Node):
    def forward(self, x: int) -> int:
        CALLED.append("last")
        if BROKEN:
            raise ValueError("the last node fails")
        return x * 10


def hosted(k: int = 10) -> soma.Graph:
    """Node `a` here, `b` then `c` on host `one`, `last` here."""
    return soma.Graph.somatize(
        Add(1).named("a")
        >> (Add(k).named("b") >> Add(100).named("c")).at("one")
        >> Last().named("last")
    )


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[soma.Journal]:
    CALLED.clear()
    BROKEN.clear()
    j = soma.Journal(tmp_path / "runs.db")
    with serving(_HostsHere()):
        yield j
    j.close()
    BROKEN.clear()


def test_a_run_with_hosts_and_a_journal_returns_what_it_would_without_and_records_the_slice(
    journal: soma.Journal,
) -> None:
    g = hosted()
    assert g.forward(0, run="r", journal=journal) == g.forward(0) == 1110
    assert journal.run("r").status == "finished"
    # The slice's returned node is recorded here under its own id, as it returned.
    assert "c" in {node for node, _, _ in journal.nodes("r")}


def test_a_resume_answers_a_finished_slice_from_the_journal_without_sending_it_again(
    journal: soma.Journal,
) -> None:
    g = hosted()
    BROKEN.append(True)
    with pytest.raises(ValueError, match="the last node fails"):
        g.forward(0, run="r", journal=journal)
    assert CALLED == ["a", "b", "c", "last"]
    CALLED.clear()
    BROKEN.clear()
    assert g.resume("r", journal=journal) == 1110
    assert CALLED == ["last"]


def test_a_slice_whose_node_was_edited_runs_again_on_resume(journal: soma.Journal) -> None:
    BROKEN.append(True)
    with pytest.raises(ValueError, match="the last node fails"):
        hosted(k=10).forward(0, run="r", journal=journal)
    CALLED.clear()
    BROKEN.clear()
    assert hosted(k=20).resume("r", journal=journal) == 1210
    assert CALLED == ["b", "c", "last"]


def test_a_folder_cache_beside_the_journal_still_reaches_the_hosts(
    journal: soma.Journal, tmp_path: Path
) -> None:
    g = hosted()
    cache = soma.Cache(tmp_path / "cache")
    assert g.forward(0, run="first", journal=journal, cache=cache) == 1110
    CALLED.clear()
    # Another run, the same cache: the host finds its slice's nodes in the folder.
    assert g.forward(0, run="second", journal=journal, cache=cache) == 1110
    assert CALLED == []
