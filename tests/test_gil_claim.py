"""What the compiled module tells the interpreter about the GIL: that it needs it. Nobody has
audited `soma._soma` for running without one (`crates/soma-python/src/lib.rs` lists what an
audit must cover), and since PyO3 0.28 a module says it is safe without one unless it declares
otherwise, so a free-threaded interpreter would run it with its GIL off."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parent.parent / "crates" / "soma-python" / "src" / "lib.rs"


def test_the_compiled_module_declares_that_it_needs_the_gil() -> None:
    declarations = re.findall(r"#\[pymodule(?:\((.*?)\))?\]", LIB.read_text())
    assert declarations == ["gil_used = true"]


@pytest.mark.skipif(
    not sysconfig.get_config_var("Py_GIL_DISABLED"), reason="needs a free-threaded interpreter"
)
def test_a_free_threaded_interpreter_keeps_its_gil_on_once_soma_is_loaded() -> None:
    child = subprocess.run(
        [sys.executable, "-c", "import sys, soma; print(sys._is_gil_enabled())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.stdout.strip() == "True", child.stderr
