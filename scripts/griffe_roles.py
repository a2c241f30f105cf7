"""A griffe extension for the API reference (mkdocs.yml): Sphinx roles in docstrings rendered as inline code.

distlock's docstrings name other objects the Sphinx way (``:class:`Lock```, ``:meth:`lock```); mkdocstrings renders
docstrings as Markdown, which would show the role itself (``:class:``) before the name. This turns each role into
the bare name in backticks, and leaves everything else alone. Nothing in the library imports it.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

__all__ = ["SphinxRoles"]

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|exc|data|obj):`~?([^`]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrite ``:role:`name``` as ```name``` in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(r"`\1`", obj.docstring.value)
