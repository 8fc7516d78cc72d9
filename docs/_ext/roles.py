"""A griffe extension for the API reference: the docstrings' Sphinx roles (:func:`x`, :class:`~a.b`)
become code spans (`x`, `b`), which Markdown renders; double backquotes are Markdown code already."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|obj|exc):`(~?)([^`]+)`")


def _span(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_span, obj.docstring.value)
