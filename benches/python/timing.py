"""Medians of repeated, interleaved timings, for a noisy two-core machine.

Contenders are timed round-robin — one sample of each, then the next round — so that a burst
of load from elsewhere lands on all of them rather than on whichever happened to be running.
Each sample times ``number`` back-to-back calls, with ``number`` chosen so a sample lasts about
``sample_s``: a single microsecond-scale call is below what ``perf_counter`` measures well.
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

# A contender's setting: entered around each of its samples, its warm-up included, outside none
# of the time but the calls' — what lets two contenders differ in a process-wide switch.
Setting = Callable[[], AbstractContextManager[object]]


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median of the samples and their interquartile range."""

    median_s: float
    q1_s: float
    q3_s: float
    samples: int
    calls_per_sample: int

    @property
    def spread(self) -> float:
        """The interquartile range as a fraction of the median: how much to trust the figure."""
        return (self.q3_s - self.q1_s) / self.median_s if self.median_s > 0 else 0.0


def _sample(
    fn: Callable[[], object],
    number: int,
    prepare: Callable[[], object] | None = None,
    setting: Setting = nullcontext,
) -> float:
    # As timeit does: a collection triggered by another contender's garbage would otherwise be
    # charged to whoever happens to be running when it fires.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with setting():
            return _timed(fn, number, prepare)
    finally:
        if gc_was_enabled:
            gc.enable()


def _timed(fn: Callable[[], object], number: int, prepare: Callable[[], object] | None) -> float:
    if prepare is None:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - start) / number
    # With a ``prepare`` step (emptying a trace, say) each call is timed on its own and the
    # step between calls is left out: a clock read costs well under 0.1 µs, and the calls
    # timed this way last hundreds of µs.
    total = 0.0
    for _ in range(number):
        prepare()
        start = time.perf_counter()
        fn()
        total += time.perf_counter() - start
    return total / number


def _calls_per_sample(
    fn: Callable[[], object],
    sample_s: float,
    warmup_s: float,
    prepare: Callable[[], object] | None = None,
    setting: Setting = nullcontext,
) -> int:
    """Warms ``fn`` up for about ``warmup_s`` (at least two calls) and sizes its samples."""
    durations: list[float] = []
    deadline = time.perf_counter() + warmup_s
    while len(durations) < 2 or time.perf_counter() < deadline:
        durations.append(_sample(fn, 1, prepare, setting))
    one_call = statistics.median(durations)
    return max(1, math.ceil(sample_s / one_call)) if one_call > 0 else 1


def compare(
    contenders: Mapping[str, Callable[[], object]],
    *,
    repeat: int,
    sample_s: float,
    warmup_s: float,
    prepare: Mapping[str, Callable[[], object]] | None = None,
    settings: Mapping[str, Setting] | None = None,
) -> dict[str, Timing]:
    """Times every contender ``repeat`` times, interleaved, and returns their medians.

    ``prepare`` maps a contender to a step run before each of its calls, outside the time;
    ``settings`` maps a contender to a :data:`Setting` entered around each of its samples.
    """
    steps = dict(prepare or {})
    chosen = dict(settings or {})
    numbers = {
        name: _calls_per_sample(
            fn, sample_s, warmup_s, steps.get(name), chosen.get(name, nullcontext)
        )
        for name, fn in contenders.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(repeat):
        # Rotating the order keeps any contender from always following the same neighbour
        # (whose garbage, cache footprint or lingering threads it would inherit).
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(
                _sample(
                    contenders[name],
                    numbers[name],
                    steps.get(name),
                    chosen.get(name, nullcontext),
                )
            )
    timings = {}
    for name, values in samples.items():
        quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        timings[name] = Timing(
            median_s=statistics.median(values),
            q1_s=quartiles[0],
            q3_s=quartiles[2],
            samples=len(values),
            calls_per_sample=numbers[name],
        )
    return timings


def once(fn: Callable[[], object]) -> float:
    """Seconds taken by a single call: for one-off costs such as building a graph."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class OtherLoad:
    """How busy other processes kept the machine while the ``with`` block ran, as a fraction
    of all its cores: the figure that says whether a run was disturbed.

    Busy time for the whole machine comes from /proc/stat, this process's own (threads and
    waited-for children included) from ``os.times``; the difference is everybody else's.
    """

    share: float | None = None

    @staticmethod
    def _machine_busy_s() -> float | None:
        try:
            with open("/proc/stat") as stat:
                fields = [int(v) for v in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
        # already counted in user, and idle plus iowait is what nobody used.
        busy = sum(fields[:8]) - fields[3] - fields[4]
        return busy / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def __enter__(self) -> OtherLoad:
        self._start = (time.perf_counter(), self._machine_busy_s(), self._own_s())
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._start[0]
        busy, start_busy = self._machine_busy_s(), self._start[1]
        if busy is None or start_busy is None or wall <= 0:
            return
        others = (busy - start_busy) - (self._own_s() - self._start[2])
        self.share = max(0.0, others) / (wall * (os.cpu_count() or 1))
