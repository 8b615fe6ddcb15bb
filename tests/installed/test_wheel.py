"""Soma as a user gets it: the wheel `make wheel` builds, installed into a fresh venv outside the
checkout with nothing else, then the quickstart and one run of each feature, from there.

Collected only where ``SOMA_WHEELS`` names the folder holding the wheel: `make test-wheel` (part
of `make test`) and `make test-py313` set it. Every script runs with ``python -I`` in a folder of
its own, so nothing of the checkout (its ``python/`` folder, ``PYTHONPATH``) can stand in for what
was installed; the venv is made by the interpreter running the tests, so under `make test-py313`
the same wheel is installed into a 3.13 venv.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_docs import blocks

ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("SOMA_WHEELS", ROOT / "dist"))


class Installed:
    """A fresh venv holding the wheel alone, and a folder of a user's project beside it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.python = home / "venv" / "bin" / "python"

    def run(self, code: str) -> str:
        """What ``code`` prints, run by the venv's interpreter in the project's folder."""
        done = subprocess.run(
            [str(self.python), "-I", "-c", textwrap.dedent(code)],
            cwd=self.home / "project",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    wheels = sorted(WHEELS.glob("*.whl"))
    assert len(wheels) == 1, f"one wheel in {WHEELS} (`make wheel` builds it), found {wheels}"
    home = tmp_path_factory.mktemp("user")
    assert not home.resolve().is_relative_to(ROOT), "the venv is outside the checkout"
    (home / "project").mkdir()
    venv = [sys.executable, "-m", "venv", str(home / "venv")]
    subprocess.run(venv, check=True, capture_output=True, timeout=100)
    there = Installed(home)
    # --no-index: the wheel needs nothing that is not in it.
    pip = [str(there.python), "-m", "pip", "install", "--quiet", "--no-index", str(wheels[0])]
    subprocess.run(pip, check=True, capture_output=True, text=True, timeout=100)
    return there


def test_the_wheel_installs_soma_graph_whose_import_is_soma_from_the_venv(
    installed: Installed,
) -> None:
    printed = installed.run(
        """
        import importlib.metadata, sys
        import soma, soma._soma
        print(importlib.metadata.version("soma-graph"))
        print(soma.__file__.startswith(sys.prefix), soma._soma.__file__.startswith(sys.prefix))
        print(sorted(importlib.metadata.metadata("soma-graph").get_all("Provides-Extra")))
        """
    )
    version, inside, extras = printed.splitlines()
    assert version
    assert inside == "True True"
    assert extras == "['otel', 'postgres', 'ray', 'view']"


def test_the_wheel_carries_the_views_page_files_and_reports_without_the_extra(
    installed: Installed,
) -> None:
    printed = installed.run(
        """
        import importlib.resources
        import soma

        static = importlib.resources.files("soma.view") / "static"
        print(sorted(entry.name for entry in static.iterdir()))

        class Inc(soma.Node):
            def forward(self, x):
                return x + 1

        trace = soma.Trace()
        soma.Graph.somatize(Inc()).forward(1, trace=trace)
        soma.report(trace, "run.html")
        print("<style>" in open("run.html").read())
        try:
            soma.view()
        except ImportError as error:
            print(str(error).splitlines()[-1])
        """
    )
    assert printed.splitlines() == [
        "['inflate.js', 'live.js', 'run.js', 'runs.js', 'tiles.js', 'view.css']",
        "True",
        "hint: pip install 'soma-graph[view]'",
    ]


def test_the_quickstart_prints_what_the_readme_shows(installed: Installed) -> None:
    readme = blocks(ROOT / "README.md")[0]
    assert readme.prints is not None
    assert installed.run((ROOT / "examples" / "quickstart.py").read_text()) == readme.prints


def test_a_wave_runs_its_two_branches_at_the_same_time(installed: Installed) -> None:
    printed = installed.run(
        """
        import threading
        import soma

        meet = threading.Barrier(2, timeout=5)  # Both branches in flight, or an error.

        class Branch(soma.Node):
            def forward(self, x):
                meet.wait()
                return threading.get_ident()

        g = soma.Graph.somatize(Branch().named("left") | Branch().named("right"))
        out = g.forward(0)
        print(g.plan().kind, out["left"] != out["right"])
        """
    )
    assert printed == "Wave True\n"


def test_an_async_node_runs_under_aforward_and_forward(installed: Installed) -> None:
    printed = installed.run(
        """
        import asyncio
        import soma

        class Fetch(soma.Node):
            async def forward(self, x):
                await asyncio.sleep(0)
                return x * 2

        g = soma.Graph.somatize(Fetch() >> Fetch().named("again"))
        print(asyncio.run(g.aforward(3)), g.forward(4))
        """
    )
    assert printed == "12 16\n"


def test_a_rerun_from_a_cache_folder_calls_no_node_again(installed: Installed) -> None:
    printed = installed.run(
        """
        import soma

        class Calls(list):
            # A log of the calls, keyed as empty (the guide's way): appending to it is no edit.
            def __reduce__(self):
                return (Calls, ())

        calls = Calls()

        class Square(soma.Node):
            def forward(self, x):
                calls.append(x)
                return x * x

        g = soma.Graph.somatize(Square() >> Square().named("again"))
        first = g.forward(3, cache=soma.Cache("runs"))
        called = len(calls)
        second = g.forward(3, cache=soma.Cache("runs"))
        print(first, second, called, len(calls) - called)
        """
    )
    assert printed == "81 81 2 0\n"


def test_each_runs_its_body_on_every_item_in_order(installed: Installed) -> None:
    printed = installed.run(
        """
        import soma

        class Split(soma.Node):
            def forward(self, text):
                return text.split()

        class Shout(soma.Node):
            def forward(self, word):
                return word.upper()

        g = soma.Graph.somatize(Split() >> soma.each(Shout()))
        print(g.forward("one two three"))
        """
    )
    assert printed == "['ONE', 'TWO', 'THREE']\n"


def test_a_stream_yields_each_items_result_in_input_order(installed: Installed) -> None:
    printed = installed.run(
        """
        import soma

        class Inc(soma.Node):
            def forward(self, x):
                return x + 1

        class Double(soma.Node):
            def forward(self, x):
                return x * 2

        g = soma.Graph.somatize(Inc() >> Double())
        print(list(g.map(range(5))))
        """
    )
    assert printed == "[2, 4, 6, 8, 10]\n"
