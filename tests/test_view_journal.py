"""The view with a journal: every run any process recorded there is listed beside this process's
own, a paused run shows paused, and its questions are answered from a form — the run resumed
here when this process ran it, the answers kept for whoever resumes it otherwise."""

from __future__ import annotations

import json
import textwrap
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import soma
from conftest import DEADLINE, run_script
from soma.view import RunStatus
from test_view import BROWSER_DEADLINE, SCREENSHOTS, address, browser, get, wait_for

__all__ = ["browser"]  # The Chromium fixture, shared with test_view.


class Approve(soma.Node):
    """Asks whether to go on, and says when it got its answer."""

    answered = threading.Event()

    def forward(self, x: int, ctx: soma.Ctx) -> str:
        answer = ctx.ask(f"ship {x}?")
        Approve.answered.set()
        return f"{x}:{answer}"


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[soma.Journal]:
    opened = soma.Journal(tmp_path / "runs.db")
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def journal_view(journal: soma.Journal) -> Iterator[Any]:
    opened = soma.view(port=0, quiet=True, journal=journal)
    try:
        yield opened
    finally:
        opened.close()


def post(url: str, fields: dict[str, str]) -> tuple[int, str, str | None]:
    """Posts ``fields`` as a form; the status, the body and where it was sent (a redirect is
    not followed)."""

    class Kept(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(Kept)
    data = urllib.parse.urlencode(fields).encode()
    try:
        with opener.open(urllib.request.Request(url, data=data), timeout=DEADLINE) as answer:
            return answer.status, answer.read().decode(), None
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode(), refused.headers.get("Location")


def record_in_another_process(path: Path) -> None:
    """A finished run and a paused one, recorded in ``path`` by a child process."""
    script = textwrap.dedent(
        f"""
        import soma

        class Ask(soma.Node):
            def forward(self, x, ctx):
                return (x, ctx.ask("which colour?"))

        journal = soma.Journal({str(path)!r})
        soma.Graph.somatize(soma.node(lambda x: x + 1).named("add")).forward(
            1, run="done-elsewhere", journal=journal
        )
        try:
            soma.Graph.somatize(Ask().named("ask")).forward(2, run="paused-elsewhere",
                                                            journal=journal)
        except soma.Paused:
            print("paused")
        """
    )
    ran = run_script(script)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "paused"


def until(what: str, condition: Any) -> None:
    """Waits, at most ``DEADLINE``, for ``condition()``: a state another thread reaches."""
    waited = threading.Event()
    for _ in range(int(DEADLINE / 0.01)):
        if condition():
            return
        waited.wait(0.01)
    pytest.fail(f"never {what}")


def listed(opened: Any) -> dict[str, dict[str, Any]]:
    status, body = get(address(opened, "/api/runs"))
    assert status == 200
    return {row["id"]: row for row in json.loads(body)}


def test_a_view_with_a_journal_lists_the_runs_other_processes_recorded_there(
    journal: soma.Journal, journal_view: Any
) -> None:
    record_in_another_process(Path(journal.target))
    rows = listed(journal_view)
    assert (rows["done-elsewhere"]["status"], rows["done-elsewhere"]["done"]) == ("finished", 1)
    assert (rows["paused-elsewhere"]["status"], rows["paused-elsewhere"]["total"]) == (
        "paused",
        1,
    )
    status, page = get(address(journal_view, "/runs/done-elsewhere"))
    assert status == 200
    assert "finished" in page
    status, node = get(address(journal_view, "/api/runs/done-elsewhere/nodes/add"))
    assert (status, json.loads(node)["state"]) == (200, "finished")


def test_a_journaled_streams_row_counts_its_node_calls_never_done_above_its_total(
    journal: soma.Journal, journal_view: Any
) -> None:
    script = textwrap.dedent(
        f"""
        import soma

        journal = soma.Journal({journal.target!r})
        graph = soma.Graph.somatize(
            soma.node(lambda x: x + 1).named("add") >> soma.node(lambda x: x * 2).named("double")
        )
        print(list(graph.map(range(5), run="stream", journal=journal)))
        print(graph.forward(1, run="single", journal=journal))
        """
    )
    ran = run_script(script)
    assert (ran.returncode, ran.stdout.split()) == (0, ["[2,", "4,", "6,", "8,", "10]", "4"])
    rows = listed(journal_view)
    assert rows["stream"]["progress"] == "10 calls"
    assert rows["single"]["progress"] == "2 / 2 nodes"
    status, runs_page = get(address(journal_view, "/"))
    assert status == 200
    assert "<td>10 calls</td>" in runs_page
    assert "10 / 2" not in runs_page
    status, run_page = get(address(journal_view, "/runs/stream"))
    assert (status, "<span id=progress>10 calls</span>" in run_page) == (200, True)


def test_a_run_of_this_process_that_pauses_shows_paused_with_its_asking_node_paused(
    journal: soma.Journal, journal_view: Any
) -> None:
    graph = soma.Graph.somatize(Approve().named("approve"))
    with pytest.raises(soma.Paused):
        graph.forward(1, run="here", journal=journal)
    (recorded,) = [run for run in journal_view.runs() if run.journal_run == "here"]
    assert recorded.status is RunStatus.PAUSED
    assert recorded.node_json("approve")["state"] == "paused"
    # Listed once: as this process recorded it, not again from the journal.
    assert [row["id"] for row in listed(journal_view).values()] == [recorded.id]


def test_answering_a_run_this_process_ran_resumes_it_here(
    journal: soma.Journal, journal_view: Any
) -> None:
    Approve.answered.clear()
    graph = soma.Graph.somatize(Approve().named("approve"))
    with pytest.raises(soma.Paused):
        graph.forward(3, run="to-ship", journal=journal)
    status, form = get(address(journal_view, "/runs/to-ship/answer"))
    assert status == 200
    assert "approve: ship 3?" in form
    status, _, sent_to = post(address(journal_view, "/runs/to-ship/answer"), {"approve": "yes"})
    assert (status, sent_to) == (303, "/runs/to-ship")
    assert Approve.answered.wait(DEADLINE), "the answered run was not resumed here"
    until("finished", lambda: journal.run("to-ship").status == "finished")
    assert graph.resume("to-ship", journal=journal) == "3:yes"


def test_answers_to_a_run_another_process_ran_wait_in_the_journal_for_its_resume(
    journal: soma.Journal, journal_view: Any
) -> None:
    record_in_another_process(Path(journal.target))
    status, _, _ = post(address(journal_view, "/runs/paused-elsewhere/answer"), {"ask": "blue"})
    assert status == 303
    assert journal.run("paused-elsewhere").questions == {}
    script = textwrap.dedent(
        f"""
        import soma

        class Ask(soma.Node):
            def forward(self, x, ctx):
                return (x, ctx.ask("which colour?"))

        graph = soma.Graph.somatize(Ask().named("ask"))
        print(graph.resume("paused-elsewhere", journal=soma.Journal({journal.target!r})))
        """
    )
    ran = run_script(script)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "(2, 'blue')"


def test_an_answer_to_no_open_question_is_refused_with_the_form_again(
    journal: soma.Journal, journal_view: Any
) -> None:
    graph = soma.Graph.somatize(Approve().named("approve"))
    with pytest.raises(soma.Paused):
        graph.forward(4, run="wrong-path", journal=journal)
    status, page, _ = post(address(journal_view, "/runs/wrong-path/answer"), {"nobody": "yes"})
    assert status == 409
    assert "no open question at `nobody`" in page
    assert "approve: ship 4?" in page
    assert journal.run("wrong-path").status == "paused"


def test_a_view_beyond_loopback_takes_no_answer_without_its_token(
    journal: soma.Journal,
) -> None:
    opened = soma.view(port=0, host="0.0.0.0", quiet=True, journal=journal)
    try:
        status, _, _ = post(address(opened, "/runs/any/answer"), {"ask": "yes"})
        assert status == 403
    finally:
        opened.close()


def test_chromium_answers_a_paused_run_from_its_page_and_sees_it_finish(
    journal: soma.Journal, journal_view: Any, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    Approve.answered.clear()
    graph = soma.Graph.somatize(Approve().named("approve"))
    with pytest.raises(soma.Paused):
        graph.forward(5, run="browser-run", journal=journal)
    (recorded,) = [run for run in journal_view.runs() if run.journal_run == "browser-run"]
    browser.get(address(journal_view, f"/runs/{recorded.id}"))
    wait_for(browser, "the answer link", lambda d: d.find_elements(By.ID, "answer"))
    browser.find_element(By.ID, "answer").click()
    wait_for(browser, "the form", lambda d: d.find_elements(By.ID, "q0"))
    browser.find_element(By.ID, "q0").send_keys("ship it")
    browser.save_screenshot(str(SCREENSHOTS / "view-answer-form.png"))
    browser.find_element(By.ID, "submit").click()
    assert Approve.answered.wait(BROWSER_DEADLINE), "the answered run was not resumed"
    wait_for(
        browser,
        "the resumed run finished",
        lambda d: d.find_element(By.ID, "status").text == "finished",
    )
    browser.save_screenshot(str(SCREENSHOTS / "view-answered-run.png"))
    assert journal.run("browser-run").status == "finished"
