"""The documentation site (`make docs`): it builds in strict mode, every public name of `soma` has
a docstring, and in a browser — headless Chromium, reading the site from file:// as a user who
opens `site/index.html` does — its pages render without a console error, its search finds a
method, and nothing is fetched from outside the machine.

The site is built once for the module, into a temporary folder, with the pinned MkDocs of
`constraints.txt`. The browser is Debian's `chromium` and `chromium-driver`, which
`.ci/chromium-from-debian.sh` installs (`make test` runs it); where they are missing the browser's
tests skip, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
# How long the browser may take to show what a test waits for.
PATIENCE = 30.0
# A page of each kind: the home, a page of the guide, a page of the reference.
PAGES = ("index.html", "getting-started.html", "reference/graph.html")


def load_hook() -> Any:
    """`docs/hooks/public_api_documented.py`, the check `mkdocs build` runs, as a module."""
    spec = importlib.util.spec_from_file_location(
        "public_api_documented", ROOT / "docs" / "hooks" / "public_api_documented.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as `make docs` builds it (strict), into a folder of its own."""
    folder = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return folder


def test_the_site_builds_in_strict_mode_with_the_guide_and_the_reference(site: Path) -> None:
    pages = {path.relative_to(site).as_posix() for path in site.rglob("*.html")}
    assert {"index.html", "streams.html", "reference/graph.html"} <= pages, sorted(pages)
    # The reference is the code's: `Graph.amap`, its signature and its docstring.
    graph = (site / "reference" / "graph.html").read_text()
    assert 'id="soma.Graph.amap"' in graph
    assert "concurrency" in graph
    # `Graph.map`, with its signature.
    assert 'id="soma.Graph.map"' in graph
    assert "in_flight" in graph.split('id="soma.Graph.map"', 1)[1].split('id="soma.Graph.', 1)[0]


def test_the_strict_build_fails_naming_a_broken_link_a_missing_anchor_and_an_unknown_reference(
    tmp_path: Path,
) -> None:
    # The site's own configuration and pages, in a copy whose home page has the three mistakes.
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for shared in ("python", "BENCHMARKS.md"):
        (tmp_path / shared).symlink_to(ROOT / shared)
    home = tmp_path / "docs" / "index.md"
    home.write_text(
        home.read_text()
        + "\n[a page that is not there](no-such-page.md), "
        + "[an anchor that is not there](streams.md#no-such-section), "
        + "[`soma.Graph.no_such_method`][soma.Graph.no_such_method]\n"
    )
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode != 0
    assert "no-such-page.md" in built.stderr
    assert "no-such-section" in built.stderr
    assert "soma.Graph.no_such_method" in built.stderr


def test_every_public_name_of_soma_has_its_entry_in_the_reference(site: Path) -> None:
    entries = set()
    for page in (site / "reference").glob("*.html"):
        entries |= set(re.findall(r'id="(soma[\w.]*)"', page.read_text()))
    public = load_hook().public_objects()
    assert len(public) > 60  # soma's __all__ and its public modules' names were read.
    # A name exported twice (`soma.CycleError`, `soma.errors.CycleError`) has one entry, under
    # either name or where it is defined.
    shown = entries | {public[name].path for name in entries & set(public)}
    missing = [name for name, obj in public.items() if not {name, obj.path} & shown]
    assert missing == []


def test_every_public_name_of_soma_has_a_docstring() -> None:
    assert load_hook().undocumented() == []


def test_the_docstring_check_names_what_a_public_name_leaves_unexplained(tmp_path: Path) -> None:
    package = tmp_path / "soma"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A package."""

            from soma import errors

            __all__ = ["Documented", "bare", "errors", "explained", "half_explained"]


            class Documented:
                """Documented; ``limit`` is how many."""

                limit: int = 0
                unexplained: int = 0
                explained: int = 0
                """Explained on its own."""

                def method(self) -> None:
                    pass

                def _private(self) -> None:
                    pass


            def bare() -> None:
                pass


            def explained(x: int, *, ceiling: int = 3) -> int:
                """At most ``ceiling``.

                Args:
                    x: a number.
                """
                return min(x, ceiling)


            def half_explained(x: int, y: int) -> int:
                """``x`` alone."""
                return x
            '''
        )
    )
    (package / "errors.py").write_text(
        '__all__ = ["Failure"]\n\nclass Failure(Exception):\n    pass\n'
    )
    assert load_hook().undocumented("soma", tmp_path) == [
        "`soma.Documented.method` has no docstring",
        "`soma.Documented.unexplained`, an attribute, is neither documented nor named",
        "`soma.bare` has no docstring",
        "`soma.errors.Failure` has no docstring",
        "`soma.errors` has no docstring",
        "`soma.half_explained` does not name its parameter `y`",
    ]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium, keeping its console and its network log."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "Chromium is not installed (`chromium` and `chromium-driver`, which "
            ".ci/chromium-from-debian.sh installs as root)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # As root (CI) Chromium runs only without its sandbox; a container's small /dev/shm would
    # crash its renderer.
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1600",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def visit(browser: Any, url: str) -> list[str]:
    """Opens ``url`` and waits until it is loaded; returns what its console said at SEVERE."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser")  # What an earlier page said is that page's.
    browser.get(url)
    WebDriverWait(browser, PATIENCE).until(
        lambda driver: driver.execute_script("return document.readyState") == "complete"
    )
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def requested(browser: Any) -> list[str]:
    """Every URL the pages asked for since the last call, from Chrome's network log."""
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


@pytest.mark.parametrize(
    ("page", "shows"),
    [
        ("index.html", "h1#soma"),
        ("streams.html", "h1#streams"),
        ("reference/graph.html#soma.Graph.amap", '[id="soma.Graph.amap"]'),
    ],
)
def test_a_page_renders_from_file_without_a_console_error(
    browser: Any, site: Path, page: str, shows: str
) -> None:
    from selenium.webdriver.common.by import By

    path, _, anchor = page.partition("#")
    errors = visit(browser, (site / path).as_uri() + (f"#{anchor}" if anchor else ""))
    assert browser.find_element(By.CSS_SELECTOR, shows).is_displayed()
    assert errors == []


def test_the_sites_own_search_finds_amap_from_file(browser: Any, site: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    assert visit(browser, (site / "index.html").as_uri()) == []
    field = WebDriverWait(browser, PATIENCE).until(
        expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input"))
    )
    field.click()
    field.send_keys("amap")

    def found(driver: Any) -> list[str]:
        items = driver.find_elements(By.CSS_SELECTOR, ".md-search-result__item a")
        return [item.get_attribute("href") for item in items]

    links = WebDriverWait(browser, PATIENCE).until(found)
    # Each result links to where the word is, the word in the query (`?h=amap`, to highlight).
    places = {(urlsplit(link).path, urlsplit(link).fragment) for link in links}
    assert ((site / "reference" / "graph.html").as_posix(), "soma.Graph.amap") in places, links


def test_no_page_of_the_site_asks_for_anything_outside_the_machine(
    browser: Any, site: Path
) -> None:
    requested(browser)  # What the other tests asked for is theirs to answer.
    pages = [(site / page).as_uri() for page in PAGES]
    for page in pages:
        assert visit(browser, page) == []
    urls = requested(browser)
    # The log was read: the pages themselves are in it, and the scripts they load.
    assert set(pages) <= set(urls)
    assert any(url.endswith(".js") for url in urls), urls
    outside = [url for url in urls if not url.startswith(("file://", "data:", "blob:"))]
    assert outside == [], outside
