"""A griffe extension for the API reference: the docstrings' Sphinx roles (:func:`x`, :class:`~a.b`)
become code spans (`x`, `b`), which Markdown renders; double backquotes are Markdown code already.
A Google-style entry that describes several parameters at once (``a, b: what they are``) becomes
one entry each (the description on the first, the others pointing to it), so that the reference
finds each one's type and default in the signature (a grouped entry matched no parameter and
showed "required" as the default of optional keywords)."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:func|class|mod|meth|data|attr|obj|exc):`(~?)([^`]+)`")
SECTION = re.compile(r"^(Args|Arguments|Parameters|Keyword Args|Keyword Arguments|Other Parameters):\s*$")
GROUPED = re.compile(r"^(\s+)(\w+(?:, *\w+)+):\s*(.*)$")


def _span(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def split_grouped_parameters(text: str) -> str:
    """``text`` with each parameter entry that names several parameters (``a, b: ...``, in an Args
    section) split into one entry per name: the first keeps the description (continuation lines
    included), the others read "described with ``a`` above"."""
    out: list[str] = []
    in_args, pending, indent = False, [], ""
    for line in text.splitlines():
        if pending and (not line.strip() or len(line) - len(line.lstrip()) <= len(indent)):
            out += [f"{indent}{name}: described with ``{pending[0]}`` above." for name in pending[1:]]
            pending = []
        if SECTION.match(line):
            in_args = True
        elif line.strip() and not line[0].isspace():
            in_args = False
        grouped = GROUPED.match(line) if in_args else None
        if grouped is None:
            out.append(line)
            continue
        indent, names, rest = grouped.groups()
        pending = [n.strip() for n in names.split(",")]
        out.append(f"{indent}{pending[0]}: {rest}")
    out += [f"{indent}{name}: described with ``{pending[0]}`` above." for name in pending[1:]]
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = split_grouped_parameters(ROLE.sub(_span, obj.docstring.value))
