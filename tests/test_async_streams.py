"""Streams of async nodes as a user writes them: ``g.amap`` as good as ``asyncio.gather`` with its
defaults (an async node's concurrency follows ``in_flight``), ``ordered``/``on_error`` as in
``map``, the results before a failing input delivered, and the streams' events bounded.

Concurrency is shown by rendezvous (``asyncio.Barrier`` with a deadline), never by timing.
"""

from __future__ import annotations

import asyncio
import textwrap
import threading
from typing import Any

import pytest

import soma
from conftest import DEADLINE, run_script
from test_async import AsyncCall, AsyncMeet, Call, run


class Boom(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# An async node's default concurrency follows `in_flight`


def test_amap_runs_an_async_node_on_in_flight_items_at_once_by_default() -> None:
    async def main() -> list[Any]:
        barrier = asyncio.Barrier(8)
        g = soma.Graph.somatize(AsyncMeet(barrier))
        return [y async for y in g.amap(range(16), in_flight=8)]

    assert run(main()) == list(range(16))


def test_map_runs_an_async_node_on_in_flight_items_at_once_by_default() -> None:
    barrier = threading.Barrier(4, timeout=DEADLINE)

    async def meet(x: Any) -> Any:
        await asyncio.to_thread(barrier.wait)
        return x

    g = soma.Graph.somatize(AsyncCall(meet))
    assert list(g.map(range(8), in_flight=4)) == list(range(8))


def test_an_async_node_given_a_concurrency_of_one_takes_one_item_at_a_time() -> None:
    inside = 0
    most = 0

    async def count(x: Any) -> Any:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        for _ in range(3):
            await asyncio.sleep(0)
        inside -= 1
        return x

    for g in (
        soma.Graph.somatize(AsyncCall(count).concurrency(1)),
        soma.Graph.somatize(AsyncCall(count).named("c")),
    ):
        if "c" in g:
            g.concurrency("c", 1)

        async def main(g: soma.Graph = g) -> list[Any]:
            return [y async for y in g.amap(range(10), in_flight=5)]

        most = 0
        assert run(main()) == list(range(10))
        assert most == 1


def test_a_sync_node_of_an_async_stream_keeps_one_item_at_a_time_by_default() -> None:
    inside = 0
    most = 0
    lock = threading.Lock()

    def count(x: Any) -> Any:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        for _ in range(1000):
            pass
        with lock:
            inside -= 1
        return x

    async def later(x: Any) -> Any:
        await asyncio.sleep(0)
        return x

    g = soma.Graph.somatize(AsyncCall(later) >> Call(count))

    async def main() -> list[Any]:
        return [y async for y in g.amap(range(30), in_flight=10)]

    assert run(main()) == list(range(30))
    assert most == 1


def test_an_expressions_concurrency_holds_for_each_of_its_nodes() -> None:
    async def main() -> list[Any]:
        first, second = asyncio.Barrier(3), asyncio.Barrier(3)
        g = soma.Graph.somatize(
            (AsyncMeet(first).named("a") >> AsyncMeet(second).named("b")).concurrency(3)
        )
        assert g.concurrencies() == {"a": 3, "b": 3}
        return [y async for y in g.amap(range(6), in_flight=1_000)]

    assert run(main()) == list(range(6))


def test_an_expressions_concurrency_leaves_a_nodes_own_as_it_is() -> None:
    g = soma.Graph.somatize(
        (
            Call(lambda x: x).concurrency(2).named("own") >> Call(lambda x: x).named("other")
        ).concurrency(5)
    )
    assert g.concurrencies() == {"own": 2, "other": 5}


# ---------------------------------------------------------------------------------------------
# `ordered` and `on_error`, as in `map`


async def _fail_on_two(x: Any) -> Any:
    await asyncio.sleep(0)
    if x == 2:
        raise Boom("two")
    return x * 10


def test_amap_unordered_gives_index_and_result_pairs_as_items_finish() -> None:
    async def main() -> list[Any]:
        release = asyncio.Event()

        async def last_first(x: Any) -> Any:
            # Item 0 finishes only once the reader has a result in hand: unordered, that can
            # only be item 1's; in input order, none comes, and item 0's wait ends in a timeout.
            if x == 0:
                await asyncio.wait_for(release.wait(), DEADLINE)
            return x

        g = soma.Graph.somatize(AsyncCall(last_first))
        pairs = []
        async for pair in g.amap(range(2), ordered=False):
            pairs.append(pair)
            release.set()
        return pairs

    assert run(main()) == [(1, 1), (0, 0)]


def test_amap_on_error_collect_gives_a_failed_record_in_the_items_place() -> None:
    g = soma.Graph.somatize(AsyncCall(_fail_on_two).named("f"))

    async def main() -> list[Any]:
        return [y async for y in g.amap(range(4), on_error="collect")]

    out = run(main())
    assert out[:2] == [0, 10]
    assert out[3] == 30
    failed = out[2]
    assert isinstance(failed, soma.Failed)
    assert (failed.index, failed.input, failed.node) == (2, 2, "f")
    assert isinstance(failed.exception, Boom)
    assert failed.exception.__notes__ == ["raised in soma node `f`"]


def test_amap_on_error_skip_leaves_the_failed_item_out_and_goes_on() -> None:
    g = soma.Graph.somatize(AsyncCall(_fail_on_two))

    async def main() -> list[Any]:
        return [y async for y in g.amap(range(4), on_error="skip")]

    assert run(main()) == [0, 10, 30]


def test_amap_refuses_an_on_error_it_does_not_know_where_it_is_called() -> None:
    g = soma.Graph.somatize(AsyncCall(_fail_on_two))
    with pytest.raises(ValueError, match="on_error"):
        g.amap([1], on_error="ignore")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# An input that raises


def _raising_at_five() -> Any:
    yield from range(5)
    raise Boom("the source at 5")


async def _raising_at_five_async() -> Any:
    for i in range(5):
        yield i
    raise Boom("the source at 5")


@pytest.mark.parametrize("source", [_raising_at_five, _raising_at_five_async])
def test_amap_delivers_the_items_read_before_its_input_raised_then_raises_it(source: Any) -> None:
    async def double(x: Any) -> Any:
        await asyncio.sleep(0)
        return 2 * x

    g = soma.Graph.somatize(AsyncCall(double))
    got: list[Any] = []

    async def main() -> None:
        async for y in g.amap(source()):
            got.append(y)

    with pytest.raises(Boom, match="the source at 5"):
        run(main())
    assert got == [0, 2, 4, 6, 8]


def test_map_of_async_nodes_delivers_the_items_read_before_its_input_raised_then_raises_it() -> (
    None
):
    async def double(x: Any) -> Any:
        await asyncio.sleep(0)
        return 2 * x

    g = soma.Graph.somatize(AsyncCall(double))
    got: list[Any] = []
    results = g.map(_raising_at_five())
    got = [next(results) for _ in range(5)]
    with pytest.raises(Boom, match="the source at 5"):
        next(results)
    assert got == [0, 2, 4, 6, 8]


# ---------------------------------------------------------------------------------------------
# Clients bound to a loop, closed with it

# A client such as aiohttp's session: bound to the loop it was made on, closed by awaiting
# `close()` there, and saying "Unclosed client session" when collected unclosed.
LOOP_CLIENTS = textwrap.dedent(
    """
    import asyncio, sys
    import soma

    class Client:
        def __init__(self):
            self.loop = asyncio.get_running_loop()
            self.closed = False

        async def close(self):
            assert asyncio.get_running_loop() is self.loop
            await asyncio.sleep(0)
            self.closed = True
            print("closed on its own loop", flush=True)

        def __del__(self):
            if not self.closed:
                print("Unclosed client session", flush=True)

    clients = {}

    async def client():
        loop = asyncio.get_running_loop()
        if loop not in clients:
            clients[loop] = Client()
            await soma.on_loop_close(clients[loop].close)
        return clients[loop]

    class Fetch(soma.Node):
        async def forward(self, x):
            await client()
            return x

    g = soma.Graph.somatize(Fetch())
    print("forward", g.forward(1), g.forward(2), list(g.map([3, 4])), flush=True)

    async def main():
        return await g.aforward(5), [y async for y in g.amap([6, 7])]

    print("aforward", asyncio.run(main()), flush=True)
    print("clients", len(clients), flush=True)
    """
)


def test_a_client_bound_to_a_loop_is_closed_on_it_when_the_loop_closes() -> None:
    child = run_script(LOOP_CLIENTS)
    assert child.returncode == 0, child.stderr
    out = child.stdout.splitlines()
    assert out[:3] == ["forward 1 2 [3, 4]", "closed on its own loop", "aforward (5, [6, 7])"]
    # The loop `asyncio.run` made closed its client as it ended; the loop Soma keeps, at exit.
    assert out[3:] == ["clients 2", "closed on its own loop"]
    assert "Unclosed" not in child.stdout + child.stderr
