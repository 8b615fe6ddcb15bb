"""``python -m soma.runs``: a journal's runs, listed, shown and pruned from a terminal.

The package's ``soma.runs(journal)`` is the same listing in code (it is bound over this module's
name in ``soma``, so importing this module leaves it as it is).
"""

from soma.journal._journal import runs

__all__ = ["runs"]
