"""Runs that survive: a journal per run, resume after a crash in any process, effects done once,
and pauses for a person's answer (the guide's "Runs that survive").

``soma.Journal`` keeps runs; ``g.forward(x, run="id", journal=j)`` records one as its nodes
return; ``g.resume("id", journal=j)`` finishes it; ``ctx.effect`` and ``ctx.ask`` inside a node
make its side effects happen once and let it wait for a person; ``soma.runs(j)`` lists them.
"""

from soma.journal._active import JournalWarning
from soma.journal._journal import Journal, JournalRun, Paused, runs

__all__ = ["Journal", "JournalRun", "JournalWarning", "Paused", "runs"]
