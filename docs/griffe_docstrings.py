"""A Griffe extension: probekit's docstrings as mkdocstrings reads them, the code untouched.

- ``Example:`` (probekit's section title) becomes ``Examples:``, the Google-style title Griffe
  knows, so doctests render as code instead of as an admonition of Markdown text.
- Sphinx roles (``:func:`~probekit.load```, ``:class:`Model```, ...) become optional
  cross-references: a link where the target is documented, plain code otherwise.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

EXAMPLE_TITLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def role_to_autoref(match: re.Match[str]) -> str:
    """``:func:`~a.b.c``` -> an optional autoref to ``a.b.c`` shown as ``c`` (``~``) or whole."""
    tilde, target = match.group(1), match.group(2).strip()
    identifier = target.removesuffix("()").lstrip(".~")
    shown = target.rsplit(".", 1)[-1] if tilde else target
    return f'<autoref identifier="{identifier}" optional><code>{shown}</code></autoref>'


def markdown_docstring(text: str) -> str:
    """The docstring with the section title and roles as mkdocstrings reads them."""
    return SPHINX_ROLE.sub(role_to_autoref, EXAMPLE_TITLE.sub(r"\1Examples:", text))


class ProbekitDocstrings(griffe.Extension):
    """Rewrite every loaded object's docstring with :func:`markdown_docstring`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Called once per module, class, function and attribute Griffe loads."""
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
