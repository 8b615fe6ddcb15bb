"""The suite's own guard: what a user would see go wrong while a test passes — a log record at
ERROR, an exception Python could only ignore, an exception that ended a thread, a Rust panic on
a child's stderr — is a finding that fails the test (``conftest.no_logged_errors``), in this
process and in every Python process a test starts. Each test here causes one, checks that it
was found, and takes it back, so that the guard does not fail the test itself."""

from __future__ import annotations

import logging
import threading

import pytest

import conftest
from conftest import run_script


def taken_back() -> list[str]:
    """The findings so far, which the guard will then not see."""
    return conftest._take_findings()


def test_an_error_logged_in_a_child_is_a_finding() -> None:
    run = run_script("import logging; logging.getLogger('lib').error('it broke'); print('ok')")
    assert run.stdout == "ok\n"
    [found] = taken_back()
    assert "log record ERROR from 'lib'" in found
    assert "it broke" in found


def test_a_child_configuring_its_own_logging_still_does_and_is_still_heard() -> None:
    run = run_script(
        "import logging\n"
        "logging.basicConfig(format='mine: %(message)s')\n"
        "logging.getLogger('lib').error('it broke')\n"
    )
    assert run.stderr == "mine: it broke\n"
    assert len(taken_back()) == 1


def test_a_warning_logged_in_a_child_is_not_a_finding() -> None:
    run_script("import logging; logging.getLogger('lib').warning('careful')")
    assert taken_back() == []


def test_an_exception_ignored_in_a_child_is_a_finding() -> None:
    run_script(
        "class Dies:\n"
        "    def __del__(self):\n"
        "        raise RuntimeError('in a finalizer')\n"
        "Dies()\n"
    )
    [found] = taken_back()
    assert found.startswith("--- Exception ignored")
    assert "RuntimeError: in a finalizer" in found


def test_an_exception_that_ends_a_childs_thread_is_a_finding() -> None:
    run_script(
        "import threading\n"
        "def fail():\n"
        "    raise ValueError('in a thread')\n"
        "t = threading.Thread(target=fail, name='worker'); t.start(); t.join()\n"
    )
    [found] = taken_back()
    assert "exception in thread 'worker'" in found
    assert "ValueError: in a thread" in found


def test_an_exception_ending_a_childs_program_is_its_own_to_check_not_a_finding() -> None:
    run = run_script("raise SystemExit('bye')")
    assert run.returncode == 1
    run = run_script("raise KeyError('mine')")
    assert "KeyError: 'mine'" in run.stderr
    assert taken_back() == []


def test_a_rust_panic_on_a_childs_stderr_is_a_finding() -> None:
    run_script("import sys; sys.stderr.write(\"thread 'x' panicked at src/lib.rs:1:1:\\n\")")
    [found] = taken_back()
    assert "a Rust panic" in found


def test_an_error_logged_here_on_another_thread_is_a_finding() -> None:
    thread = threading.Thread(target=lambda: logging.getLogger("lib").error("from a thread"))
    thread.start()
    thread.join()
    [found] = taken_back()
    assert "from a thread" in found


def test_a_logger_that_does_not_propagate_is_heard_too() -> None:
    quiet = logging.getLogger("soma-tests.quiet")
    quiet.propagate = False
    try:
        quiet.error("said to nobody")
    finally:
        quiet.propagate = True
    [found] = taken_back()
    assert "said to nobody" in found


@pytest.mark.expected_errors("on purpose")
def test_a_test_that_expects_an_error_says_so_by_its_marker_and_passes() -> None:
    # Left for the guard, which lets it pass: the marker's pattern matches it.
    logging.getLogger("lib").error("logged on purpose")
    run_script("import logging; logging.getLogger('lib').error('on purpose, in a child')")
