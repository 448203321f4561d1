"""The documentation site (issue 24): built once with warnings as errors, served on 127.0.0.1 and every page
opened in a real headless browser (Debian's ``chromium``, driven by :mod:`tests.docs.browser`): each page loads
with its title and main content and logs no script, console or network error, and every internal link (a page,
a ``#anchor``, an image) resolves to a file and an element id that exist.

Without chromium (or the ``docs`` extra) the tests skip with the reason, except where the ``CI`` variable is
set: there they fail, since CI must really run them (``.ci/run`` installs chromium).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from tests.docs.browser import Browser

REPO = Path(__file__).resolve().parents[2]
#: The options of `make docs`: warnings are errors (the Makefile's recipe is checked to use them too).
SPHINX_OPTS = ("-W", "--keep-going", "-b", "html")


def unavailable(reason: str) -> None:
    """Skip with ``reason``, or fail where ``CI`` is set: CI must run the browser tests."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        unavailable("no chromium on PATH (Debian: `apt-get install -y chromium`; .ci/run installs it in CI)")
    assert found is not None
    return found


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built from docs/ once per session, into a temp folder."""
    for module in ("sphinx", "myst_parser", "furo"):
        try:
            __import__(module)
        except ImportError:
            unavailable(f"{module} is not installed (the `docs` extra: pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", *SPHINX_OPTS, "-q", str(REPO / "docs"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"the docs build warns or fails:\n{done.stderr[-6000:]}"
    return out


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """``root`` served over HTTP on a free 127.0.0.1 port; yields the base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Dom:
    """What a page shows: its title, whether its main part has a heading, its ids, links and images."""

    title: str = ""
    main_heading: bool = False
    ids: set[str] = field(default_factory=set)
    links: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.dom = Dom()
        self._in_title = False
        self._main_depth = 0  # > 0 inside <main> or role="main"
        self._stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.dom.ids.add(str(found["id"]))
        if found.get("name") and tag == "a":
            self.dom.ids.add(str(found["name"]))
        if tag == "a" and found.get("href") is not None:
            self.dom.links.append(str(found["href"]))
        if tag == "img" and found.get("src"):
            self.dom.images.append(str(found["src"]))
        self._in_title = tag == "title"
        if tag in {"h1", "h2"} and self._main_depth:
            self.dom.main_heading = True
        if tag in {"br", "img", "input", "link", "meta", "hr", "source", "wbr", "area", "base", "col", "embed"}:
            return
        entering_main = tag == "main" or found.get("role") == "main"
        if self._main_depth or entering_main:
            self._main_depth += 1
        self._stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False
        if tag in self._stack:
            while self._stack:
                if self._main_depth:
                    self._main_depth -= 1
                if self._stack.pop() == tag:
                    break

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.dom.title += data.strip()


def read_dom(html: str) -> Dom:
    reader = _Reader()
    reader.feed(html)
    return reader.dom


def site_pages(root: Path) -> list[str]:
    """Every HTML page of a built site, as paths relative to its root."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.html") if not {"_static", "_sources"} & set(p.parts))


def _target(root: Path, base: str, page: str, href: str) -> tuple[Path, str] | None:
    """The file and fragment an internal ``href`` of ``page`` points at; ``None`` for external links."""
    url = urlsplit(urljoin(base + page, href))
    if url.scheme not in {"http", "https"} or f"{url.scheme}://{url.netloc}/" != base:
        return None
    path = root / unquote(url.path).lstrip("/")
    return (path / "index.html" if path.is_dir() else path), unquote(url.fragment)


#: Pages opened with a query: the search page runs a search, so its results (and their links) are checked.
QUERIES = {"search.html": "?q=ReplayBuffer"}


def check_site(root: Path, browser: str) -> list[str]:
    """Opens every page of the site at ``root`` in the browser; returns the problems found (empty: none)."""
    problems: list[str] = []
    doms: dict[str, Dom] = {}
    with serve(root) as base, Browser(browser) as chromium:
        for name in site_pages(root):
            opened = chromium.open(base + name + QUERIES.get(name, ""))
            problems += [f"{name}: {error}" for error in opened.errors]
            doms[name] = read_dom(opened.html)
    by_file = {root / name: dom for name, dom in doms.items()}
    for name, dom in doms.items():
        if not dom.title:
            problems.append(f"{name}: no title (did it load?)")
        if not dom.main_heading:
            problems.append(f"{name}: no main content with a heading")
        for kind, refs in (("link", dom.links), ("image", dom.images)):
            for href in refs:
                target = _target(root, base, name, href)
                if target is None:
                    continue
                path, fragment = target
                if not path.is_file():
                    problems.append(f"{name}: broken {kind} {href!r} (no file {path.relative_to(root)})")
                    continue
                if fragment and path.suffix == ".html":
                    ids = by_file[path].ids if path in by_file else read_dom(path.read_text()).ids
                    if fragment not in ids:
                        problems.append(f"{name}: broken {kind} {href!r} (no id {fragment!r} there)")
    return problems


def test_every_page_loads_and_every_internal_link_resolves(site: Path, browser: str) -> None:
    names = site_pages(site)
    for page in ("index.html", "api.html", "getting-started.html", "changelog.html", "migration/objectrl.html"):
        assert page in names
    assert check_site(site, browser) == []


def test_the_search_page_finds_the_buffer(site: Path, browser: str) -> None:
    with serve(site) as base, Browser(browser) as chromium:
        results = read_dom(chromium.open(base + "search.html" + QUERIES["search.html"]).html)
    assert "api.html#objectrl_buffer.ReplayBuffer" in results.links


def test_the_site_shows_the_api_and_the_figures(site: Path) -> None:
    api = read_dom((site / "api.html").read_text())
    for name in (
        "ReplayBuffer",
        "PrioritizedReplayBuffer",
        "errors.InvalidArgumentError",
        "flow.RateLimiter",
        "tasks.TaskReplayBuffer",
        "trajectory.TrajectoryReplayBuffer",
        "async_buffer.AsyncSequenceBuffer",
        "distributed.SharedBuffer",
        "SumTree",
        "Engine",
        "core.keys.RESERVED_KEYS",
        "distributed.RemoteBuffer",
        "Schema",
        "Field",
        "TransitionKeys",
    ):
        assert f"objectrl_buffer.{name}" in api.ids, name
    images = read_dom((site / "index.html").read_text()).images
    assert {Path(src).name for src in images} >= {"dqn_cartpole.png", "apex_dqn.png"}


def test_the_checker_finds_broken_links_and_pages_that_do_not_load(tmp_path: Path, browser: str) -> None:
    main = '<html><head><title>{}</title></head><body><div role="main"><h1 id="top">T</h1>{}</div></body></html>'
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        main.format(
            "Home",
            (
                '<a href="#top">ok</a><a href="sub/other.html#there">ok</a><a href="sub/">ok</a>'
                '<a href="https://example.org/x.html">external</a>'
                '<a href="missing.html">broken page</a><a href="sub/other.html#nowhere">broken anchor</a>'
                '<img src="gone.png">'
            ),
        )
    )
    (tmp_path / "sub" / "other.html").write_text(main.format("Other", '<p id="there">x</p><a href="../#top">ok</a>'))
    (tmp_path / "sub" / "index.html").write_text("<html><body><p>no title, no heading</p></body></html>")
    (tmp_path / "sub" / "broken-js.html").write_text(
        main.format("Broken JS", '<script>console.error("from the page")</script><script>null.x</script>').replace(
            "</head>", '<script src="../_static/gone.js"></script></head>'
        )
    )
    # an anchor made by a script exists only in the loaded page: the browser sees it
    (tmp_path / "sub" / "js.html").write_text(
        main.format(
            "JS",
            (
                '<a href="#made">ok</a>'
                '<script>document.body.appendChild(document.createElement("p")).id = "made"</script>'
            ),
        )
    )
    problems = sorted(check_site(tmp_path, browser))
    logged = [p for p in problems if re.match(r"[^:]+: (console|network|script) error", p)]
    for page, *words in (
        ("sub/broken-js.html", "console error", "from the page"),
        ("sub/broken-js.html", "network error", "404", "_static/gone.js"),
        ("sub/broken-js.html", "script error", "TypeError"),
        ("index.html", "network error", "404", "gone.png"),
    ):
        assert [p for p in logged if p.startswith(page) and all(w in p for w in words)], (page, words, logged)
    assert len(logged) == 4, logged
    assert [p for p in problems if p not in logged] == [
        "index.html: broken image 'gone.png' (no file gone.png)",
        "index.html: broken link 'missing.html' (no file missing.html)",
        "index.html: broken link 'sub/other.html#nowhere' (no id 'nowhere' there)",
        "sub/index.html: no main content with a heading",
        "sub/index.html: no title (did it load?)",
    ]


def test_make_docs_builds_as_this_test_does() -> None:
    """`make docs` and this test build with the same options (warnings are errors)."""
    recipe = [line for line in (REPO / "Makefile").read_text().splitlines() if "-m sphinx" in line]
    assert recipe and all(option in recipe[0].split() for option in SPHINX_OPTS), recipe
    assert "docs/_build/html" in recipe[0]


def test_without_a_browser_ci_fails_where_a_laptop_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set: no chromium"):
        unavailable("no chromium")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no chromium"):
        unavailable("no chromium")
