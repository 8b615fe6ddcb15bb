"""An async node's asyncio is its own: its `asyncio.timeout`, its `TaskGroup`, the tasks it
starts, its nesting and its context behave as in a coroutine the caller's own task awaits, and
nothing of it reaches the run, the loop Soma keeps, or the nodes after it.

A cancellation is the run's only when the run was cancelled (Ctrl-C, its task cancelled, its
deadline): asyncio's rule, the task's ``cancelling()`` count, which a node's `asyncio.timeout`
or `TaskGroup` takes back (``uncancel()``) once it has turned its cancellation into its own
error. Each case runs through ``forward`` and ``aforward``, alone and in the shapes users make
(after a node, beside one in a wave, inside an `each` step). What may hang or crash (a task of
the node's raising `SystemExit`, nesting without end) runs in a child process with a deadline.
"""

from __future__ import annotations

import asyncio
import contextvars
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

import soma
from conftest import DEADLINE, run_script


async def never() -> None:
    await asyncio.Event().wait()


class CatchesItsTimeout(soma.Node):
    """Gives up on a slow call after 10 ms, as a client with a timeout of its own does."""

    async def forward(self, x: Any) -> str:
        try:
            async with asyncio.timeout(0.01):
                await never()
        except TimeoutError:
            return "gave up"
        return "never"


class LetsItsTimeoutOut(soma.Node):
    async def forward(self, x: Any) -> None:
        async with asyncio.timeout(0.01):
            await never()


class Refused(Exception):
    pass


class FailsInATaskGroup(soma.Node):
    """A task group one of whose tasks fails while another waits: the group cancels the node's
    own task, and raises an `ExceptionGroup` once the waiting task has ended."""

    async def forward(self, x: Any) -> None:
        async def refuse() -> None:
            raise Refused("no")

        async with asyncio.TaskGroup() as group:
            group.create_task(never())
            group.create_task(refuse())


class RaisesCancelledError(soma.Node):
    async def forward(self, x: Any) -> None:
        raise asyncio.CancelledError("the node's own")


class After(soma.Node):
    def forward(self, x: Any) -> Any:
        return ("after", x)


# How a node is placed in a graph, as users place it: the node's id is always `n`.
SHAPES: dict[str, Callable[[soma.Node], Any]] = {
    "alone": lambda node: node.named("n"),
    "before a sync node": lambda node: node.named("n") >> After(),
    "in a wave": lambda node: node.named("n") | After(),
    "in an each step": lambda node: soma.each(node.named("n")),
}


def run(how: str, shape: str, node: soma.Node) -> Any:
    """The graph of `node` placed as `shape` says, run by `how`, within the test's deadline."""
    g = soma.Graph.somatize(SHAPES[shape](node))
    x = [1] if shape == "in an each step" else 1
    if how == "forward":
        return g.forward(x, timeout=DEADLINE)
    return asyncio.run(asyncio.wait_for(g.aforward(x), DEADLINE))


def own(shape: str, value: Any) -> Any:
    """What a run of `shape` returns when node `n` returns `value`."""
    return {
        "alone": value,
        "before a sync node": ("after", value),
        "in a wave": {"n": value, "after": ("after", 1)},
        "in an each step": [value],
    }[shape]


def note(shape: str) -> str:
    """The note naming node `n` placed as `shape` says: inside a step, by its path."""
    node = "each/n" if shape == "in an each step" else "n"
    return f"raised in soma node `{node}`"


HOWS = ["forward", "aforward"]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("how", HOWS)
def test_a_node_that_catches_its_own_timeout_returns_its_value_and_the_run_goes_on(
    how: str, shape: str
) -> None:
    assert run(how, shape, CatchesItsTimeout()) == own(shape, "gave up")


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("how", HOWS)
def test_a_node_that_lets_its_own_timeout_out_fails_with_timeout_error_naming_it(
    how: str, shape: str
) -> None:
    with pytest.raises(TimeoutError) as raised:
        run(how, shape, LetsItsTimeoutOut())
    assert type(raised.value) is TimeoutError
    assert note(shape) in getattr(raised.value, "__notes__", [])


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("how", HOWS)
def test_a_failing_task_group_in_a_node_is_its_exception_group_naming_it(
    how: str, shape: str
) -> None:
    with pytest.raises(ExceptionGroup) as raised:
        run(how, shape, FailsInATaskGroup())
    assert [type(error) for error in raised.value.exceptions] == [Refused]
    assert note(shape) in getattr(raised.value, "__notes__", [])


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("how", HOWS)
def test_a_node_raising_cancelled_error_itself_fails_with_it_naming_the_node(
    how: str, shape: str
) -> None:
    with pytest.raises(asyncio.CancelledError) as raised:
        run(how, shape, RaisesCancelledError())
    assert raised.value.args == ("the node's own",)
    assert note(shape) in getattr(raised.value, "__notes__", [])


class RecoversFromItsTaskGroup(soma.Node):
    """Catches the `ExceptionGroup` of its failing task group and answers all the same: on
    Python 3.11 and 3.12 the group leaves the node's task with a cancellation counted that it
    never took back (CPython's own), which must not pass for the run's."""

    async def forward(self, x: Any) -> str:
        try:
            await FailsInATaskGroup().forward(x)
        except ExceptionGroup:
            return "recovered"
        return "never"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_node_recovering_from_its_failing_task_group_returns_its_value_through_forward(
    shape: str,
) -> None:
    assert run("forward", shape, RecoversFromItsTaskGroup()) == own(shape, "recovered")


class FailsOnceThenAnswers(soma.Node):
    """Its first call fails as `fail` does; the next answers how many calls were made."""

    def __init__(self, fail: soma.Node) -> None:
        self.fail = fail
        self.calls = 0

    async def forward(self, x: Any) -> int:
        self.calls += 1
        if self.calls == 1:
            await self.fail.forward(x)
        return self.calls


@pytest.mark.parametrize(
    ("fail", "on"),
    [(LetsItsTimeoutOut(), TimeoutError), (FailsInATaskGroup(), ExceptionGroup)],
    ids=["timeout", "task group"],
)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("how", HOWS)
def test_a_retry_on_the_nodes_own_timeout_or_task_group_error_retries_it(
    how: str, shape: str, fail: soma.Node, on: type[BaseException]
) -> None:
    node = FailsOnceThenAnswers(fail).retry(1, backoff=0.001, on=(on,))
    assert run(how, shape, node) == own(shape, 2)


TASK_RAISES = textwrap.dedent(
    """
    import asyncio
    import soma

    class StartsATask(soma.Node):
        async def forward(self, x):
            async def task():
                raise __RAISED__("from the node's task")

            started = asyncio.__START__(task())
            await asyncio.sleep(0.05)
            return ("node done", started.done())

    class Plain(soma.Node):
        async def forward(self, x):
            await asyncio.sleep(0)
            return x + 1

    g = soma.Graph.somatize(StartsATask())
    try:
        print("forward:", g.forward(1, timeout=10), flush=True)
    except BaseException as raised:
        print("forward raised:", type(raised).__name__, flush=True)
    other = soma.Graph.somatize(Plain())
    print("later forward:", other.forward(1, timeout=10), flush=True)
    print("later map:", list(other.map([1, 2], timeout=10)), flush=True)
    print("same graph again:", g.forward(2, timeout=10), flush=True)
    """
)


@pytest.mark.parametrize("start", ["create_task", "ensure_future"])
@pytest.mark.parametrize("raised", ["SystemExit", "KeyboardInterrupt"])
# The kept loop's exception handler logs what the task raised, and asyncio logs the task as one
# whose exception nobody retrieved (the node never awaited it): the user sees both, and the
# loop runs on.
@pytest.mark.expected_errors(
    r"a task on Soma's event loop raised (SystemExit|KeyboardInterrupt)",
    r"Task exception was never retrieved",
)
def test_a_base_exception_in_a_task_a_node_starts_leaves_the_kept_loop_running(
    raised: str, start: str
) -> None:
    child = run_script(TASK_RAISES.replace("__RAISED__", raised).replace("__START__", start))
    assert child.returncode == 0, child.stderr
    assert child.stdout.splitlines() == [
        "forward: ('node done', True)",
        "later forward: 2",
        "later map: [2, 3]",
        "same graph again: ('node done', True)",
    ], child.stderr
    # Shown, as a thread's uncaught exception is, never lost.
    assert f"{raised}: from the node's task" in child.stderr


def test_a_node_stopping_the_kept_loop_leaves_it_running_for_later_runs() -> None:
    script = textwrap.dedent(
        """
        import asyncio
        import soma

        class StopsTheLoop(soma.Node):
            async def forward(self, x):
                asyncio.get_running_loop().stop()
                await asyncio.sleep(0.01)
                return x + 1

        g = soma.Graph.somatize(StopsTheLoop())
        print(g.forward(1, timeout=10), g.forward(2, timeout=10), flush=True)
        """
    )
    child = run_script(script)
    assert (child.returncode, child.stdout) == (0, "2 3\n"), child.stderr


NESTED_AFORWARDS = textwrap.dedent(
    """
    import asyncio
    import sys
    import soma

    sys.setrecursionlimit(__LIMIT__)

    class Nests(soma.Node):
        \"\"\"Awaits its own graph's `aforward` on `x + 1`, without a base case.\"\"\"

        async def forward(self, x):
            return await g.aforward(x + 1)

    class Plain(soma.Node):
        async def forward(self, x):
            await asyncio.sleep(0)
            return x + 1

    g = soma.Graph.somatize(Nests())
    try:
        print("ran:", __RUN__, flush=True)
    except RecursionError as error:
        print("RecursionError", flush=True)
    print("again:", asyncio.run(soma.Graph.somatize(Plain()).aforward(1)), flush=True)
    print("forward again:", soma.Graph.somatize(Plain()).forward(1, timeout=10), flush=True)
    """
)


@pytest.mark.parametrize("limit", [2500, 100_000])
@pytest.mark.parametrize(
    "run", ["asyncio.run(g.aforward(0))", "g.forward(0, timeout=60)"], ids=["aforward", "forward"]
)
def test_aforward_nested_without_end_raises_recursion_error_and_every_graph_runs_again(
    run: str, limit: int
) -> None:
    script = NESTED_AFORWARDS.replace("__LIMIT__", str(limit)).replace("__RUN__", run)
    child = run_script(script)
    assert child.returncode == 0, child.stderr
    assert child.stdout.splitlines() == ["RecursionError", "again: 2", "forward again: 2"]


REQUEST = contextvars.ContextVar("REQUEST", default="unset")


class SetsAsync(soma.Node):
    async def forward(self, x: Any) -> Any:
        REQUEST.set("set by the node")
        await asyncio.sleep(0)
        return x


class SetsSync(soma.Node):
    def forward(self, x: Any) -> Any:
        REQUEST.set("set by the node")
        return x


class ReadsAsync(soma.Node):
    async def forward(self, x: Any) -> str:
        return REQUEST.get()


class ReadsSync(soma.Node):
    def forward(self, x: Any) -> str:
        return REQUEST.get()


SETTERS: dict[str, type[soma.Node]] = {"async": SetsAsync, "sync": SetsSync}
READERS: dict[str, type[soma.Node]] = {"async": ReadsAsync, "sync": ReadsSync}


def after_setter(how: str, setter: str, reader: str, limit: float | None) -> str:
    """What node `reads` sees of the variable node `sets`, just before it, set."""
    g = soma.Graph()
    g.node(SETTERS[setter]().named("sets"))
    g.node(READERS[reader]().named("reads"))
    g.edge("sets", "reads")
    g.time_limit("sets", limit)
    if how == "forward":
        seen: str = g.forward(1, timeout=DEADLINE)
        return seen
    seen = asyncio.run(asyncio.wait_for(g.aforward(1), DEADLINE))
    return seen


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("setter", list(SETTERS))
@pytest.mark.parametrize("how", HOWS)
def test_what_a_time_limited_node_sets_in_contextvars_stays_its_own(
    how: str, setter: str, reader: str
) -> None:
    assert after_setter(how, setter, reader, 5.0) == "unset"


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("how", HOWS)
def test_what_an_async_node_without_a_time_limit_sets_reaches_the_later_nodes_of_its_branch(
    how: str, reader: str
) -> None:
    assert after_setter(how, "async", reader, None) == "set by the node"


@pytest.mark.parametrize("how", HOWS)
def test_what_a_sync_node_without_a_time_limit_sets_reaches_the_later_sync_nodes_of_its_piece(
    how: str,
) -> None:
    assert after_setter(how, "sync", "sync", None) == "set by the node"
