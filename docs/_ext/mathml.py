"""A MkDocs hook: the pages' math becomes MathML when the site is built, so the site shows its formulas
with no script and no network (a cluster node, an offline laptop, ``mkdocs serve`` anywhere).

``pymdownx.arithmatex`` (generic mode) leaves each formula as its TeX source, HTML-escaped, in
``<span class="arithmatex">\\(...\\)</span>`` (inline) or ``<div class="arithmatex">\\[...\\]</div>``
(display); this hook replaces the source by the MathML that ``latex2mathml`` writes for it (which
every current browser renders natively), keeping the wrapper, whose display form scrolls sideways
when wider than the page (``docs/stylesheets/math.css``). A formula it cannot convert fails the
build, naming the page and the formula. Chromium renders no ``mathvariant`` but ``normal`` (MathML
Core), so double-struck letters (``\\mathbb E``) are written as their Unicode characters.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

ARITHMATEX = re.compile(
    r'<(?P<tag>span|div) class="arithmatex">\s*\\(?P<open>[(\[])(?P<tex>.*?)\\[)\]]\s*</(?P=tag)>', re.S
)

DOUBLE_STRUCK = re.compile(r'<mi mathvariant="double-struck">([A-Za-z])</mi>')
# the double-struck capitals that Unicode placed in its Letterlike Symbols block, not at 0x1D538 + i
LETTERLIKE = dict(zip("CHNPQRZ", "\u2102\u210d\u2115\u2119\u211a\u211d\u2124", strict=True))


def double_struck(match: re.Match) -> str:
    """``<mi mathvariant="double-struck">E</mi>`` as ``<mi>&#x1D53C;</mi>`` (mathematical alphanumerics)."""
    letter = match[1]
    if letter in LETTERLIKE:
        return f"<mi>{LETTERLIKE[letter]}</mi>"
    base = 0x1D538 + ord(letter) - ord("A") if letter.isupper() else 0x1D552 + ord(letter) - ord("a")
    return f"<mi>{chr(base)}</mi>"


def to_mathml(match: re.Match, where: str) -> str:
    """One arithmatex wrapper with its TeX replaced by MathML (``display="block"`` for ``\\[...\\]``)."""
    tex = html.unescape(match["tex"]).strip()
    display = "block" if match["open"] == "[" else "inline"
    try:
        mathml = convert(tex, display=display)
    except Exception as error:  # latex2mathml raises several types; each is a formula it cannot read
        raise ValueError(f"{where}: cannot convert the formula {tex[:200]!r} to MathML: {error}") from error
    mathml = DOUBLE_STRUCK.sub(double_struck, mathml)
    return f'<{match["tag"]} class="arithmatex">{mathml}</{match["tag"]}>'


def on_page_content(html_text: str, page, **kwargs) -> str:
    return ARITHMATEX.sub(lambda m: to_mathml(m, page.file.src_uri), html_text)
