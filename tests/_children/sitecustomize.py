"""Loaded by every Python process the tests start (``tests/conftest.py`` puts this folder on
their ``PYTHONPATH``): it writes down what a user would see go wrong in that process — a log
record at ERROR or above, an exception Python could only ignore ("Exception ignored in …"), an
exception that ended a thread — into the file named by ``SOMA_TEST_FINDINGS``, one finding per
block. ``conftest.py``'s ``no_logged_errors`` reads that folder after each test and fails the
test that caused them, unless it says it expects them (``@pytest.mark.expected_errors``).

An exception that ends the child's main program is not a finding here: many tests make a child
fail on purpose and read its exit code and stderr; what it raised there is theirs to check.
Each hook hands on to the one it replaced, so the child's stderr is unchanged."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Callable

_FOLDER = os.environ.get("SOMA_TEST_FINDINGS")


def _write(kind: str, text: str) -> None:
    if not _FOLDER:
        return
    try:
        with open(os.path.join(_FOLDER, f"{os.getpid()}.txt"), "a", encoding="utf-8") as out:
            out.write(f"--- {kind} in {sys.argv[:2]!r} (pid {os.getpid()})\n{text}\n")
    except OSError:
        pass


def note_logged_errors(write: Callable[[str, str], None]) -> None:
    """Hands ``write`` every log record at ERROR or above, from any logger (one that does not
    propagate included), as it is made: through the log record factory, not a handler, so that
    the process's own ``logging.basicConfig`` still configures its logging, and not by patching
    ``logging.Logger``, whose methods would then be code of the tests' own: a cache keys a
    logger (a resource) by its type, and a type with a method of the user's by its code. Also
    what ``conftest.py`` hears the tests' own process with."""
    import logging

    make = logging.getLogRecordFactory()

    def make_and_note(*args: object, **kwargs: object) -> logging.LogRecord:
        record = make(*args, **kwargs)
        if record.levelno >= logging.ERROR:
            try:
                text = record.getMessage()
            except Exception as unformatted:  # Its arguments do not fit its message: logging says.
                text = f"{record.msg!r} (not formatted: {unformatted!r})"
            if record.exc_info:
                text += "\n" + "".join(traceback.format_exception(*record.exc_info))
            write(f"log record {record.levelname} from {record.name!r}", text)
        return record

    logging.setLogRecordFactory(make_and_note)


def _install() -> None:
    note_logged_errors(_write)

    unraisable = sys.unraisablehook

    def note_unraisable(args: sys.UnraisableHookArgs) -> None:
        exc = args.exc_value
        shown = "".join(traceback.format_exception(exc)) if exc is not None else ""
        _write("Exception ignored", f"{args.err_msg or 'in'} {args.object!r}\n{shown}")
        unraisable(args)

    sys.unraisablehook = note_unraisable

    thread_hook = threading.excepthook

    def note_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit:
            shown = "".join(
                traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback)
            )
            _write(f"exception in thread {getattr(args.thread, 'name', None)!r}", shown)
        thread_hook(args)

    threading.excepthook = note_thread


if _FOLDER:
    _install()
