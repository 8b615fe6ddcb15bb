"""Per-node policies: ``.retry(times, backoff, on)`` retries a failing call (how many times,
which exceptions, the note on the last error, a span per attempt) and ``.time_limit(seconds)``
fails a call that runs past it with ``soma.TimeLimitError`` naming the node, which a retry on
``TimeoutError`` retries; set on a node, on an expression, or by id on the graph, carried by
copies and pickles, and held to inside waves and under ``forward(timeout=)``.

A call that runs past its limit, and a backoff pause cut short by a deadline, are run in a child
process with a deadline of its own: a regression is a hang. The pauses' lengths (doubling, the
128 s cap, the jitter) are checked against an injected clock in the engine's own tests
(``crates/soma-core/tests/it/policies.rs``), not by sleeping here."""

from __future__ import annotations

import copy
import json
import pickle
import textwrap
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import soma
from conftest import interrupt_script, run_script
from test_properties import Dag, dags, expected_run


class Flaky(soma.Node):
    """Raises ``error`` on its first ``failures`` calls, then returns its input plus one."""

    def __init__(self, failures: int, error: type[BaseException] = ConnectionError) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def forward(self, x: Any) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(f"call {self.calls} failed")
        return x + 1


def test_a_failing_call_is_retried_until_it_succeeds_within_its_retries() -> None:
    flaky = Flaky(2).retry(3, backoff=0)
    assert soma.Graph.somatize(flaky).forward(1) == 2
    assert flaky.calls == 3


def test_a_call_failing_every_attempt_raises_the_last_attempts_own_exception_noting_the_count() -> (
    None
):
    flaky = Flaky(100).retry(2, backoff=0)
    with pytest.raises(ConnectionError, match="call 3 failed") as raised:
        soma.Graph.somatize(flaky).forward(1)
    assert flaky.calls == 3
    assert raised.value.__notes__ == [
        "raised in soma node `flaky`",
        "soma node `flaky` failed on each of its 3 attempts",
    ]


def test_only_exceptions_of_the_listed_types_are_retried() -> None:
    flaky = Flaky(100, error=ValueError).retry(5, backoff=0, on=(ConnectionError,))
    with pytest.raises(ValueError, match="call 1 failed") as raised:
        soma.Graph.somatize(flaky).forward(1)
    assert flaky.calls == 1
    assert raised.value.__notes__ == ["raised in soma node `flaky`"]


def test_a_subclass_of_a_listed_type_is_retried_and_one_class_alone_may_be_given() -> None:
    flaky = Flaky(1, error=ConnectionResetError).retry(1, backoff=0, on=OSError)
    assert soma.Graph.somatize(flaky).forward(1) == 2
    assert flaky.calls == 2


def test_ctrl_c_raised_in_a_node_is_not_retried_by_default() -> None:
    flaky = Flaky(100, error=KeyboardInterrupt).retry(5, backoff=0)
    with pytest.raises(KeyboardInterrupt):
        soma.Graph.somatize(flaky).forward(1)
    assert flaky.calls == 1


def test_an_expressions_retry_reaches_every_node_and_a_nodes_own_wins() -> None:
    own, other = Flaky(0).retry(1, backoff=0), Flaky(0)
    g = soma.Graph.somatize((own >> other).retry(4, backoff=0.25, on=(OSError,)))
    assert g.retries() == {
        "flaky": soma.RetryPolicy(1, 0.0, (Exception,)),
        "flaky_2": soma.RetryPolicy(4, 0.25, (OSError,)),
    }


def test_the_graph_sets_and_removes_a_nodes_policies_by_id() -> None:
    g = soma.Graph()
    a = g.node(Flaky(1))
    g.retry(a, 1, backoff=0, on=(ConnectionError,))
    g.time_limit(a, 30)
    assert g.retries() == {a: soma.RetryPolicy(1, 0.0, (ConnectionError,))}
    assert g.time_limits() == {a: 30.0}
    assert g.forward(1) == 2
    g.retry(a, None)
    g.time_limit(a, None)
    assert g.retries() == {}
    assert g.time_limits() == {}


def test_policies_that_cannot_be_are_refused_where_written() -> None:
    with pytest.raises(ValueError, match="at least 0"):
        Flaky(0).retry(-1)
    with pytest.raises(ValueError, match="backoff"):
        Flaky(0).retry(1, backoff=float("nan"))
    with pytest.raises(TypeError, match="exception classes"):
        Flaky(0).retry(1, on=(ValueError, "nope"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="above 0"):
        Flaky(0).time_limit(0)
    with pytest.raises(soma.UnknownNodeError, match="`nope`"):
        soma.Graph().retry("nope", 1)
    with pytest.raises(soma.UnknownNodeError, match="`nope`"):
        soma.Graph().time_limit("nope", 1)


def test_each_attempt_is_a_span_of_the_trace() -> None:
    trace = soma.Trace()
    soma.Graph.somatize(Flaky(2).retry(2, backoff=0)).forward(1, trace=trace)
    spans = trace.spans
    assert [span.node for span in spans] == ["flaky"] * 3
    assert [span.error is not None for span in spans] == [True, True, False]


def test_in_a_wave_the_first_declared_branchs_error_wins_over_a_retried_later_one() -> None:
    first = Flaky(100, error=ValueError).retry(2, backoff=0)
    second = Flaky(100, error=KeyError).retry(2, backoff=0)
    with pytest.raises(ValueError, match="call 3 failed"):
        soma.Graph.somatize(first | second).forward(1)


def test_a_call_within_its_time_limit_returns_its_value_and_sees_the_context() -> None:
    import contextvars

    setting: contextvars.ContextVar[int] = contextvars.ContextVar("setting", default=0)

    class Reads(soma.Node):
        def forward(self, x: Any) -> Any:
            return x + setting.get()

    setting.set(10)
    assert soma.Graph.somatize(Reads().time_limit(60)).forward(1) == 11


def test_policies_travel_with_a_copy_and_a_pickle() -> None:
    g = soma.Graph.somatize(
        Flaky(0).retry(2, backoff=0.1, on=(ConnectionError, TimeoutError)) >> Flaky(0).time_limit(5)
    )
    for other in (copy.copy(g), copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        assert other.retries() == g.retries()
        assert other.time_limits() == g.time_limits()


def test_a_time_limit_error_is_a_timeout_error_and_a_run_error() -> None:
    assert issubclass(soma.TimeLimitError, TimeoutError)
    assert issubclass(soma.TimeLimitError, soma.RunError)


#: Runs __GRAPH__ (whose node `stuck` blocks until `release` is set, while `calls` counts its
#: calls) and prints what came out as one JSON line; then releases the node.
SCRIPT = textwrap.dedent(
    """
    import json, threading
    import soma

    release = threading.Event()
    calls = []

    class Stuck(soma.Node):
        def __init__(self, blocks_first=10**9):
            self.blocks_first = blocks_first

        def forward(self, x):
            calls.append(x)
            if len(calls) <= self.blocks_first:
                release.wait()
            return x + 1

    class Fails(soma.Node):
        def forward(self, x):
            raise ConnectionError("down")

    g = soma.Graph.somatize(__GRAPH__)
    try:
        out = {"result": g.forward(1, **__FORWARD__)}
    except BaseException as error:
        out = {
            "type": type(error).__name__,
            "timeout": isinstance(error, TimeoutError),
            "node": getattr(error, "node", None),
            "message": str(error),
            "notes": getattr(error, "__notes__", []),
        }
    out["calls"] = len(calls)
    release.set()
    print(json.dumps(out))
    """
)


def outcome(graph: str, **forward: Any) -> dict[str, Any]:
    script = SCRIPT.replace("__GRAPH__", graph).replace("__FORWARD__", repr(forward))
    done = run_script(script)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_call_past_its_time_limit_raises_time_limit_error_naming_the_node() -> None:
    out = outcome('Stuck().named("stuck").time_limit(0.2)')
    assert out["type"] == "TimeLimitError"
    assert out["timeout"]
    assert out["node"] == "stuck"
    assert "`stuck` ran past its time limit of 0.2 s" in out["message"]


def test_a_call_past_its_time_limit_mid_chain_stops_the_chain_there() -> None:
    out = outcome('Fails().named("a").retry(0) >> Stuck().named("stuck").time_limit(0.2)')
    assert out["type"] == "ConnectionError"
    out = outcome('Stuck().named("stuck").time_limit(0.2) >> Stuck().named("after")')
    assert (out["type"], out["node"], out["calls"]) == ("TimeLimitError", "stuck", 1)


def test_a_timed_out_call_is_retried_when_timeout_error_is_listed() -> None:
    out = outcome(
        'Stuck(blocks_first=1).named("stuck").time_limit(0.2).retry(1, on=(TimeoutError,))'
    )
    assert out == {"result": 2, "calls": 2}


def test_a_timed_out_call_failing_every_attempt_notes_the_attempts() -> None:
    out = outcome('Stuck().named("stuck").time_limit(0.1).retry(1, backoff=0, on=(TimeoutError,))')
    assert out["type"] == "TimeLimitError"
    assert out["calls"] == 2
    assert out["notes"] == ["soma node `stuck` failed on each of its 2 attempts"]


def test_a_timed_out_call_is_not_retried_when_timeout_error_is_not_listed() -> None:
    out = outcome('Stuck().named("stuck").time_limit(0.1).retry(3, on=(ConnectionError,))')
    assert (out["type"], out["calls"]) == ("TimeLimitError", 1)


def test_forward_timeout_ends_a_backoff_pause() -> None:
    out = outcome('Fails().named("a").retry(3, backoff=3600)', timeout=0.3)
    assert out["timeout"], out


def test_forward_timeout_ends_a_call_whose_time_limit_is_longer() -> None:
    out = outcome('Stuck().named("stuck").time_limit(3600)', timeout=0.3)
    assert out["timeout"], out
    assert "`stuck`" in out["message"]


def test_a_time_limit_shorter_than_forward_timeout_names_the_node() -> None:
    out = outcome('Stuck().named("stuck").time_limit(0.2)', timeout=30)
    assert (out["type"], out["node"]) == ("TimeLimitError", "stuck")


def test_a_node_left_past_its_time_limit_leaves_the_graph_usable() -> None:
    script = textwrap.dedent(
        """
        import threading
        import soma

        release = threading.Event()

        class Once(soma.Node):
            calls = 0
            def forward(self, x):
                Once.calls += 1
                if Once.calls == 1:
                    release.wait()
                return x + 1

        g = soma.Graph.somatize(Once().time_limit(0.2))
        try:
            g.forward(1)
        except soma.TimeLimitError:
            print("timed out")
        print(g.forward(1))
        release.set()
        """
    )
    done = run_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["timed", "out", "2"]


def test_ctrl_c_ends_a_backoff_pause() -> None:
    script = textwrap.dedent(
        """
        import sys, threading, time
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        import soma

        main = threading.main_thread().ident
        pausing = threading.Event()

        class Pausing(SpanProcessor):
            # The attempt's span ends as the retry's pause begins, saying how long it is.
            def on_end(self, span):
                if span.attributes and "soma.retry_in" in span.attributes:
                    pausing.set()

        def in_the_engine():
            # The main thread runs no Python code of its own, node's or observer's: its
            # innermost frame is `Graph.forward` (or `_forward`, where it goes on once its
            # arguments are checked), which called into the engine.
            frame = sys._current_frames()[main]
            return frame.f_code.co_name in (
                "forward",
                "_forward",
            ) and frame.f_code.co_filename.endswith("_graph.py")

        def ready():
            assert pausing.wait(10), "no pause began"
            # The attempt ended; once the observer's call has returned too, the main thread
            # is in the pause, or on its way there with no Python code left to run: Ctrl-C
            # now lands in the pause, never in the node.
            deadline = time.monotonic() + 10
            while not in_the_engine():
                assert time.monotonic() < deadline, "the observer never returned"
                time.sleep(0.001)
            print("ready", flush=True)

        class Fails(soma.Node):
            def __init__(self):
                self.calls = 0

            def forward(self, x):
                self.calls += 1
                raise ConnectionError("down")

        provider = TracerProvider()
        provider.add_span_processor(Pausing())
        soma.telemetry.enable(provider)
        threading.Thread(target=ready, daemon=True).start()
        fails = Fails()
        g = soma.Graph.somatize(fails.retry(3, backoff=3600))
        try:
            g.forward(1)
        except KeyboardInterrupt:
            print("interrupted after", fails.calls, "call")
        """
    )
    done = interrupt_script(script, "ready")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["interrupted", "after", "1", "call"]


def test_a_rust_nodes_failure_is_retried_when_on_lists_run_error() -> None:
    g = soma.Graph.somatize(soma.native.Add(1).named("add").retry(2, backoff=0))
    with pytest.raises(soma.RunError) as raised:
        g.forward("not a number")
    assert raised.value.__notes__ == ["soma node `add` failed on each of its 3 attempts"]
    g.retry("add", 2, backoff=0, on=(ValueError,))
    with pytest.raises(soma.RunError) as raised:
        g.forward("not a number")
    assert not getattr(raised.value, "__notes__", [])


def test_what_a_time_limited_node_sets_in_the_context_stays_its_own() -> None:
    import contextvars

    setting: contextvars.ContextVar[int] = contextvars.ContextVar("setting", default=0)

    class Sets(soma.Node):
        def forward(self, x: Any) -> Any:
            setting.set(10)
            return x

    class Reads(soma.Node):
        def forward(self, x: Any) -> Any:
            return x + setting.get()

    assert soma.Graph.somatize(Sets() >> Reads()).forward(1) == 11
    assert soma.Graph.somatize(Sets().time_limit(60) >> Reads()).forward(1) == 1


def test_policies_set_by_id_hold_for_nodes_on_a_host_and_beside_them() -> None:
    # An in-process transport: each slice runs here, as a host would run it, from its `Slice`.
    script = textwrap.dedent(
        """
        import soma
        from soma.remote import SliceRunner

        class Here:
            def load(self, key, slices, timeout=None):
                self.runners = {piece.index: SliceRunner(piece) for piece in slices}

            def run(self, key, index, inputs, timeout, token, traced):
                return self.runners[index].run(inputs)

            def cancel(self, tokens, wait=5.0):
                pass

            def unload(self, key):
                pass

        class Hosts:
            def __init__(self):
                self.one = Here()

            def host(self, name):
                return self.one

        class Flaky(soma.Node):
            def __init__(self):
                self.calls = 0

            def forward(self, x):
                self.calls += 1
                if self.calls <= 2:
                    raise ConnectionError("down")
                return x + 1

        soma.remote.use(Hosts())
        far, near = Flaky().named("far").at("one"), Flaky().named("near")
        g = soma.Graph.somatize(near >> far)
        g.retry("far", 2, backoff=0)
        g.retry("near", 2, backoff=0)
        print(g.forward(1))
        g.retry("far", None)
        far.calls = near.calls = 0
        try:
            g.forward(1)
        except ConnectionError:
            print("far not retried")
        """
    )
    done = run_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["3", "far not retried"]


def test_a_stream_holds_its_nodes_to_their_policies() -> None:
    flaky = Flaky(2).retry(2, backoff=0)
    g = soma.Graph.somatize(flaky >> Flaky(0))
    assert list(g.map([1, 2, 3])) == [3, 4, 5]
    assert flaky.calls == 5


class Asks(soma.Node):
    """Asks the driver for ``x * 10`` and returns the answer."""

    def forward(self, x: Any, ctx: Any) -> Any:
        if ctx.turn == 0:
            return soma.Await([x])
        return ctx.results[0]


class FlakyDriver:
    """Answers each request times ten, failing its first ``failures`` calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def perform(self, requests: list[Any]) -> list[Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("driver down")
        return [r * 10 for r in requests]


def test_an_awaiting_node_is_served_by_the_driver_within_its_time_limit() -> None:
    g = soma.Graph.somatize(Asks().time_limit(60))
    assert g.forward(3, driver=FlakyDriver(0)) == 30


def test_a_drivers_failure_is_not_retried_as_the_nodes_own() -> None:
    driver = FlakyDriver(1)
    g = soma.Graph.somatize(Asks().retry(3, backoff=0))
    with pytest.raises(soma.DriverError):
        g.forward(3, driver=driver)
    assert driver.calls == 1


def test_a_call_left_past_its_time_limit_does_not_hold_the_interpreter_at_exit() -> None:
    script = textwrap.dedent(
        """
        import threading
        import soma

        class Never(soma.Node):
            def forward(self, x):
                threading.Event().wait()  # never set: the call is still running at exit
                return x

        g = soma.Graph.somatize(Never().named("never").time_limit(0.1))
        try:
            g.forward(1)
        except soma.TimeLimitError as error:
            print(error.node)
        """
    )
    done = run_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["never"]


# ---------------------------------------------------------------------------------------------
# Over random graphs: retries change what a run computes in no way but the calls it makes.


class FlakyTraced(soma.Node):
    """Fails its first ``failures`` calls, then answers as ``test_properties.Traced`` does."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def forward(self, x: Any, ctx: Any) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"{ctx.node}: call {self.calls}")
        if isinstance(x, dict):
            return (ctx.node, list(x.items()))
        return (ctx.node, x)


@given(dag=dags(max_nodes=8), data=st.data())
def test_a_graph_of_flaky_nodes_with_enough_retries_computes_what_the_graph_says(
    dag: Dag, data: st.DataObject
) -> None:
    g = soma.Graph()
    for node in dag.nodes:
        failures = data.draw(st.integers(min_value=0, max_value=3), label=node)
        retries = data.draw(st.integers(min_value=failures, max_value=4), label=f"{node} retries")
        g.node(node, FlakyTraced(failures).retry(retries, backoff=0))
    for src, dst in dag.edges:
        g.edge(src, dst)
    assert g.forward(0) == expected_run(dag, 0)
    for node in dag.nodes:
        flaky = g.implementation(node)
        assert flaky.calls == flaky.failures + 1, node
