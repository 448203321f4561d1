"""Sphinx configuration of the documentation site: MyST Markdown pages, the API reference from the docstrings
(autodoc + napoleon, Google style), the furo theme. Built by ``make docs`` (warnings are errors) and by
``tests/docs/test_site.py``, which opens every page in a headless browser."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the package of this checkout, even where another copy is installed

from sphinx.ext.napoleon.docstring import GoogleDocstring  # noqa: E402

import objectrl_buffer  # noqa: E402

project = "objectrl_buffer"
author = "objectrl_buffer contributors"
copyright = "objectrl_buffer contributors"
release = version = objectrl_buffer.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# MyST: `[text](page.md#a-heading)` links to headings down to ####, as on GitHub
myst_heading_anchors = 4

# autodoc: the documented public names, members in source order, hints in the signature
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False


def _sentence_first(self: GoogleDocstring) -> tuple[str, list[str]]:
    """Napoleon reads a property's first line ``"x: y"`` as an inline type ``x``; here such a line is a sentence
    ("Which index draws the slots: ..."): the types come from the annotations."""
    lines = [self._lines.next(), *self._dedent(self._consume_to_end())]
    return "", type(self)(lines, self._config).lines()


GoogleDocstring._consume_inline_attribute = _sentence_first  # type: ignore[method-assign]

# Ray (the optional `ray` extra) is imported only when a remote buffer is launched: the API page builds
# without it, nothing is mocked.

html_theme = "furo"
html_title = f"objectrl_buffer {release}"
html_static_path: list[str] = []
