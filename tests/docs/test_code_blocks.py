"""Every code block of README.md and docs/**/*.md runs, whatever its fence tag (issue 24; the rule is in
CONTRIBUTING.md, "Code blocks in the README and the docs").

- The blocks of one page run in order, in one namespace, with a fresh temp dir as the working directory.
- Python fences (``python``, ``py``, ``python3``, ``pycon``, ``ipython``, untagged) are exec'd; a ``pycon`` or
  ``ipython`` block written with ``>>>`` prompts runs as a doctest (its printed output must match). A block is
  the ``__main__`` module while it runs, from a file of its own, so that it can spawn processes as a script does.
- Shell fences (``bash``, ``sh``, ``shell``, ``console``) run line by line with bash from the repository root,
  the venv's bin first on PATH; :data:`COVERED_TARGETS` and :data:`COVERED_PIP` map the few long commands to
  what runs them instead. In a ``console`` block, the lines after a ``$`` command are output it must print.
- Any other tag fails, as do indented code blocks and unknown MyST directives.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import traceback
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

try:
    import markdown_it
except ImportError:  # where CI is set the import error stands: CI must run these tests
    if os.environ.get("CI"):
        raise
    pytest.skip("markdown-it-py (the `docs` extra) reads the pages", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

PYTHON_TAGS = frozenset({"python", "py", "python3", "pycon", "ipython", ""})
SHELL_TAGS = frozenset({"bash", "sh", "shell", "console"})
#: MyST directives whose body is Markdown: searched for code blocks like the page around them.
ADMONITIONS = frozenset(
    {"note", "tip", "hint", "important", "warning", "caution", "attention", "danger", "error", "seealso", "admonition"}
)
#: MyST directives that show code: their argument is the language, classified like a fence tag.
CODE_DIRECTIVES = frozenset({"code-block", "code", "sourcecode"})
#: MyST directives that hold no code block (an `eval-rst` body is checked for reST code blocks).
OTHER_DIRECTIVES = frozenset({"toctree", "eval-rst", "include", "figure", "image", "math", "contents", "rubric"})

#: Commands too long to run here, and what runs them instead: ``make <target>`` by target, and editable installs.
COVERED_TARGETS = {
    "train": "tests/test_main_job.py (the main job's short re-run, bit for bit)",
    "test": ".ci/run (CI runs `make test`)",
    "test-all": ".ci/run (CI runs the suite; `make test-all` adds the slow cases)",
    "docs": "tests/docs/test_site.py (the docs build, warnings as errors)",
    "setup": "tests/test_install.py (the install)",
}
COVERED_PIP = "tests/test_install.py (the install)"
MAKE = re.compile(r"^(?:\w+=\S*\s+)*make(?:\s+-\S+|\s+\w+=\S*)*\s+([\w-]+)\b")
PIP_EDITABLE = re.compile(r"^(?:\S*/)?(?:python3?\s+-m\s+)?pip3?\s+install\s+(?:.*\s)?(?:-e|--editable)\b")
RAY = re.compile(r"^\s*(?:import ray\b|from ray\b)|\bRemoteBuffer\b|\bray\.init\b", re.M)
#: A hang guard, not a speed check: a block must run in seconds (Ray ones in ~10 s).
PAGE_TIMEOUT_S = 600
LINE_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    """One code block: the page, the 1-based line of its opening fence, its tag and its text."""

    page: Path
    line: int
    tag: str
    code: str

    @property
    def where(self) -> str:
        return f"{_name(self.page)}:{self.line} ({self.tag or 'untagged'} block)"

    @property
    def kind(self) -> str:
        return "python" if self.tag in PYTHON_TAGS else "shell" if self.tag in SHELL_TAGS else "unknown"


class BlockError(AssertionError):
    """A block that fails, or that the rule does not allow; the message names page and line."""


def _name(page: Path) -> str:
    return str(page.relative_to(REPO)) if page.is_relative_to(REPO) else str(page)


def pages() -> list[Path]:
    """README.md and every Markdown page of the site (not the built copy in docs/_build)."""
    found = [p for p in sorted(DOCS.rglob("*.md")) if "_build" not in p.relative_to(DOCS).parts]
    return [REPO / "README.md", *found]


# ------------------------------------------------------------------------------------------------ collecting
def _options_blanked(body: str) -> str:
    """A directive body with its leading ``:option: value`` lines (or ``---`` YAML block) made blank, so that
    line numbers stay those of the page."""
    lines = body.split("\n")
    if lines and lines[0].strip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)
        return "\n" * (end + 1) + "\n".join(lines[end + 1 :])
    i = 0
    while i < len(lines) and re.match(r"^:[\w-]+:", lines[i]):
        i += 1
    return "\n" * i + "\n".join(lines[i:])


def collect(page: Path, text: str | None = None, first_line: int = 1) -> list[Block]:
    """The code blocks of ``page`` in order, nested ones included.

    Raises:
        BlockError: a block the rule does not allow (another fence tag, an indented block, an unknown
            directive, a reST code block in ``eval-rst``), naming page and line.
    """
    if text is None:
        text = page.read_text(encoding="utf-8")
    blocks: list[Block] = []
    for token in markdown_it.MarkdownIt("commonmark").enable("table").parse(text):
        if token.map is None:
            continue
        line = first_line + token.map[0]
        if token.type == "code_block":
            raise BlockError(f"{_name(page)}:{line}: an indented code block is never run; use a fenced python block")
        if token.type != "fence":
            continue
        info = token.info.strip()
        tag = info.split(maxsplit=1)[0].lower() if info else ""
        directive = re.fullmatch(r"\{([\w-]+)\}", tag)
        body = token.content
        if directive is None:
            blocks.append(Block(page, line, tag, body))
        elif directive[1] in CODE_DIRECTIVES:
            language = info.split(maxsplit=1)[1].strip().lower() if " " in info else ""
            blocks.append(Block(page, line, language, _options_blanked(body)))
        elif directive[1] in ADMONITIONS:
            blocks += collect(page, _options_blanked(body), line + 1)
        elif directive[1] == "include":
            included = (page.parent / info.split(maxsplit=1)[1].strip()).resolve()
            if included.suffix == ".md" and included.is_file():
                blocks += collect(included)
        elif directive[1] == "eval-rst":
            for offset, rst in enumerate(body.split("\n")):
                code_directive = re.search(r"\.\. (code-block|code|sourcecode)::", rst)
                literal = rst.rstrip().endswith("::") and not re.match(r"\s*\.\. [\w:-]+::", rst)
                if code_directive or literal:
                    raise BlockError(f"{_name(page)}:{line + 1 + offset}: a reST code block in eval-rst is never run")
        elif directive[1] not in OTHER_DIRECTIVES:
            raise BlockError(f"{_name(page)}:{line}: MyST directive {tag} is not allowed on a tested page")
    for block in blocks:
        if block.kind == "unknown":
            raise BlockError(
                f"{block.where}: fence tag {block.tag!r} is never run; show results with print plus a comment"
                " or an assert in a python block, and tables as Markdown tables"
            )
    return blocks


# ------------------------------------------------------------------------------------------------ running
@dataclass
class PageRun:
    """What running a page did: the shell commands run, and those left to what :data:`COVERED_TARGETS` names."""

    ran: list[str]
    covered: list[tuple[str, str]]


def covered_by(command: str) -> str | None:
    """The test or job that runs ``command`` instead of this test, or ``None``: run it here."""
    make = MAKE.match(command)
    if make is not None and make[1] in COVERED_TARGETS:
        return COVERED_TARGETS[make[1]]
    return COVERED_PIP if PIP_EDITABLE.match(command) else None


def shell_commands(block: Block) -> Iterator[tuple[int, str, list[str]]]:
    """(line, command, expected output lines) of a shell block: ``\\`` continuations joined, blank and comment
    lines skipped; in a ``console`` block with ``$`` prompts, the lines after a command are its output."""
    lines = block.code.split("\n")
    prompts = block.tag == "console" and any(raw.startswith("$ ") for raw in lines)
    pending: tuple[int, str, list[str]] | None = None
    i = 0
    while i < len(lines):
        raw, number = lines[i], block.line + 1 + i
        i += 1
        if prompts and not raw.startswith("$ "):
            if pending is not None and raw.strip():
                pending[2].append(raw.strip())
            continue
        command = raw[2:] if prompts else raw
        while command.endswith("\\") and i < len(lines):
            command = command[:-1].rstrip() + " " + lines[i].removeprefix("> ").strip()
            i += 1
        if not command.strip() or command.lstrip().startswith("#"):
            continue
        if pending is not None:
            yield pending
        pending = (number, command.strip(), [])
    if pending is not None:
        yield pending


def shell_env() -> dict[str, str]:
    """The environment of shell lines: the venv's bin first on PATH, this checkout's package importable."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def run_shell(block: Block, run: PageRun) -> None:
    for number, command, expected in shell_commands(block):
        instead = covered_by(command)
        if instead is not None:
            run.covered.append((command, instead))
            continue
        # `.venv/bin/x` is the venv running the tests (this checkout may use a venv that lives elsewhere)
        real = re.sub(r"(?<![\w/.-])\.venv/bin/", f"{Path(sys.executable).parent}/", command)
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", real],
            cwd=REPO,
            env=shell_env(),
            capture_output=True,
            text=True,
            timeout=LINE_TIMEOUT_S,
            check=False,
        )
        output = done.stdout + done.stderr
        if done.returncode != 0:
            raise BlockError(f"{_name(block.page)}:{number}: `{command}` exited {done.returncode}:\n{output[-3000:]}")
        missing = [want for want in expected if want not in output]
        if missing:
            raise BlockError(f"{_name(block.page)}:{number}: `{command}` did not print {missing}:\n{output[-3000:]}")
        run.ran.append(command)


def run_python(block: Block, namespace: dict[str, Any], scripts: Path) -> None:
    if RAY.search(block.code) and importlib.util.find_spec("ray") is None:
        pytest.skip(
            f"{block.where} uses Ray and `ray` is not importable (the `ray` extra): it and the blocks after it not run"
        )
    if block.tag in {"pycon", "ipython"} and re.search(r"^\s*>>>", block.code, re.M):
        test = doctest.DocTestParser().get_doctest(block.code, namespace, block.where, str(block.page), block.line)
        report: list[str] = []
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        result = doctest.DocTestRunner(optionflags=flags).run(test, out=report.append, clear_globs=False)
        namespace.update(test.globs)
        if result.failed:
            raise BlockError(f"{block.where} printed something else than it shows:\n{''.join(report)}")
        return
    # padded so that a traceback names the page's own line numbers
    source = "\n" * block.line + block.code
    code = compile(source, str(block.page), "exec")
    # As a script of its own: the block is __main__ while it runs, so that a process it spawns re-imports it
    # from its file and finds the functions the block defines (pickled by reference to __main__).
    script = scripts / f"{block.page.stem}_{block.line}.py"
    script.write_text(source)
    main = sys.modules["__main__"]
    page_module = types.ModuleType("__main__")
    page_module.__dict__.update(namespace, __file__=str(script))
    sys.modules["__main__"] = page_module
    try:
        exec(code, page_module.__dict__)
    except Exception as exc:
        raise BlockError(f"{block.where} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.modules["__main__"] = main
        namespace.update(page_module.__dict__)


@contextlib.contextmanager
def _hang_guard(seconds: int, where: str) -> Iterator[None]:
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"{where} still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_page(blocks: list[Block], workdir: Path) -> PageRun:
    """Runs the blocks of one page in order, Python ones in one namespace with ``workdir`` as the current
    directory (restored afterwards).

    Raises:
        BlockError: the first block that fails, naming its page and line.
    """
    run = PageRun(ran=[], covered=[])
    namespace: dict[str, Any] = {"__name__": "__main__"}
    before = Path.cwd()
    os.chdir(workdir)
    try:
        with (
            _hang_guard(PAGE_TIMEOUT_S, blocks[0].where if blocks else "page"),
            tempfile.TemporaryDirectory() as scripts,
        ):
            for block in blocks:
                if block.kind == "python":
                    run_python(block, namespace, Path(scripts))
                else:
                    run_shell(block, run)
    finally:
        os.chdir(before)
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
    return run


# ------------------------------------------------------------------------------------------------ the pages
@pytest.mark.parametrize("page", pages(), ids=lambda p: _name(p))
def test_page_blocks_run(page: Path, tmp_path: Path) -> None:
    run_page(collect(page), tmp_path)


def test_the_pages_are_found() -> None:
    found = {_name(p) for p in pages()}
    assert {"README.md", "docs/index.md", "docs/api.md"} <= found
    assert not any("_build" in name for name in found)


def test_covering_tests_exist() -> None:
    """Each command the table leaves to another test names a file that exists."""
    for instead in [*COVERED_TARGETS.values(), COVERED_PIP]:
        assert (REPO / instead.split()[0]).is_file(), instead


# ------------------------------------------------------------------------------------------------ the checker
def synthetic(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


@pytest.mark.parametrize("tag", ["text", "json", "output", "mermaid", "{mermaid}", "{literalinclude}"])
def test_another_tag_fails_naming_page_and_line(tmp_path: Path, tag: str) -> None:
    page = synthetic(tmp_path, f"# T\n\n```python\nx = 1\n```\n\n```{tag}\n1\n```\n")
    with pytest.raises(BlockError, match=r"page\.md:7"):
        collect(page)


def test_indented_and_nested_blocks_are_held_to_the_rule(tmp_path: Path) -> None:
    with pytest.raises(BlockError, match=r"page\.md:3: an indented code block"):
        collect(synthetic(tmp_path, "# T\n\n    x = 1\n"))
    with pytest.raises(BlockError, match=r"page\.md:4 \(text block\)"):
        collect(synthetic(tmp_path, "# T\n\n````{note}\n```text\nhi\n```\n````\n"))
    with pytest.raises(BlockError, match=r"page\.md:4: a reST code block"):
        collect(synthetic(tmp_path, "# T\n\n```{eval-rst}\n.. code:: python\n\n   hi\n```\n"))
    with pytest.raises(BlockError, match=r"page\.md:5: a reST code block"):
        collect(synthetic(tmp_path, "# T\n\n```{eval-rst}\n.. autoclass:: X\nShown as is::\n\n   hi\n```\n"))
    assert collect(synthetic(tmp_path, "# T\n\n```{eval-rst}\n.. automodule:: objectrl_buffer.flow\n```\n")) == []
    page = synthetic(
        tmp_path, "# T\n\n````{tip}\n```python\nx = 1\n```\n````\n\n```{code-block} py\n:linenos:\ny = 2\n```\n"
    )
    assert [(b.line, b.tag, b.code.strip()) for b in collect(page)] == [(4, "python", "x = 1"), (9, "py", "y = 2")]
    assert collect(synthetic(tmp_path, "# T\n\n```{toctree}\nother\n```\n")) == []


def test_a_failing_python_block_fails_naming_its_page_line(tmp_path: Path) -> None:
    page = synthetic(tmp_path, "# T\n\n```python\nx = 1\n```\n\nText.\n\n```py\nassert x == 2, 'x is 1'\n```\n")
    with pytest.raises(BlockError, match=r"page\.md:9 \(py block\) failed: AssertionError: x is 1") as failure:
        run_page(collect(page), tmp_path)
    # the traceback points at the page's own line
    cause = failure.value.__cause__
    assert cause is not None
    frames = traceback.extract_tb(cause.__traceback__)
    assert (str(page), 10) in [(frame.filename, frame.lineno) for frame in frames]


def test_blocks_of_a_page_share_one_namespace_and_a_temp_dir(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    page = synthetic(
        tmp_path,
        "```python\nimport os\nx = 3\nopen('made.txt', 'w').write('hi')\n```\n"
        "```\nassert x == 3 and open('made.txt').read() == 'hi'\n"
        f"assert os.getcwd() == {str(work)!r}\n```\n",
    )
    before = Path.cwd()
    run_page(collect(page), work)
    assert [p.name for p in work.iterdir()] == ["made.txt"]
    assert (work / "made.txt").read_text() == "hi"
    assert Path.cwd() == before


def test_a_block_is_the_main_module_its_spawned_processes_import(tmp_path: Path) -> None:
    """A block that starts a ``spawn`` process on a function it defines runs as it does as a script."""
    page = synthetic(
        tmp_path,
        "```python\nimport multiprocessing as mp\nfrom pathlib import Path\n\n"
        "def child(path):\n    Path(path).write_text('from the child')\n\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=child, args=('out.txt',))\n"
        "    p.start()\n    p.join()\n    assert p.exitcode == 0\n```\n"
        "```python\nassert Path('out.txt').read_text() == 'from the child'\n```\n",
    )
    main = sys.modules["__main__"]
    run_page(collect(page), tmp_path)
    assert sys.modules["__main__"] is main


def test_pycon_blocks_check_what_they_print(tmp_path: Path) -> None:
    good = synthetic(tmp_path, "```pycon\n>>> y = 2\n>>> y + 1\n3\n```\n```python\nassert y == 2\n```\n")
    run_page(collect(good), tmp_path)
    bad = synthetic(tmp_path, "```pycon\n>>> 1 + 1\n3\n```\n")
    with pytest.raises(BlockError, match=r"page\.md:1 \(pycon block\) printed something else"):
        run_page(collect(bad), tmp_path)


def test_shell_lines_run_from_the_repository_root_with_the_venv_first(tmp_path: Path) -> None:
    venv_bin = Path(sys.executable).parent
    page = synthetic(
        tmp_path,
        "```bash\n# a comment\ntest -f pyproject.toml   # the repository root\n"
        f'test "$(command -v python)" = {str(venv_bin / "python")!r}\n'
        "python -c 'import objectrl_buffer' \\\n  && true\n```\n",
    )
    run = run_page(collect(page), tmp_path)
    assert len(run.ran) == 3 and run.ran[2] == "python -c 'import objectrl_buffer' && true"


def test_a_failing_shell_line_fails_naming_its_line(tmp_path: Path) -> None:
    page = synthetic(tmp_path, "# T\n\n```sh\ntrue\nfalse\ntouch never-made\n```\n")
    with pytest.raises(BlockError, match=r"page\.md:5: `false` exited 1"):
        run_page(collect(page), tmp_path)
    assert not (REPO / "never-made").exists()


def test_console_blocks_check_their_output(tmp_path: Path) -> None:
    run_page(collect(synthetic(tmp_path, "```console\n$ echo hello world\nhello world\n```\n")), tmp_path)
    with pytest.raises(BlockError, match=r"page\.md:2: `echo hello` did not print \['bye'\]"):
        run_page(collect(synthetic(tmp_path, "```console\n$ echo hello\nbye\n```\n")), tmp_path)


def test_long_commands_are_left_to_the_tests_that_run_them(tmp_path: Path) -> None:
    page = synthetic(
        tmp_path,
        "```bash\nmake train\nmake TORCH_INDEX= setup\nmake test        # what CI runs\nmake docs\n"
        'pip install -e ".[ray,examples]" --config-settings editable_mode=compat\n'
        ".venv/bin/pip install -c .ci/constraints-cpu.txt -e '.[bench]'\n```\n",
    )
    run = run_page(collect(page), tmp_path)
    assert run.ran == []
    assert [instead.split()[0] for _, instead in run.covered] == [
        "tests/test_main_job.py",
        "tests/test_install.py",
        ".ci/run",
        "tests/docs/test_site.py",
        "tests/test_install.py",
        "tests/test_install.py",
    ]
    assert covered_by("make lint") is None and covered_by("pip install torch") is None
