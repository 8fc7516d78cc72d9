"""The documentation runs: every ```python block of README.md and docs/**/*.md executes, and every
public name of the package is in the API reference.

The blocks run in one process of their own (``tests/docs_blocks.py``: its docstring and
tests/README.md give the rules: ``<!-- test: continue -->``, ``<!-- test: skip -->``, the seed
cap ``FEDSA_DOCS_MAX_SEEDS``), started once for all pages; each page is one test here.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fedsa_jax as fj

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "notebooks" not in p.parts)]
NAMES = [p.relative_to(ROOT).as_posix() for p in PAGES]

sys.path.insert(0, str(Path(__file__).parent))
from docs_blocks import python_blocks  # noqa: E402


@pytest.fixture(scope="module")
def outcomes():
    """Each page's outcome (None: every block ran), from one run of tests/docs_blocks.py."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "docs_blocks.py"), *NAMES],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    return json.loads(lines[-1])


@pytest.mark.parametrize("page", NAMES)
def test_code_blocks_run(page, outcomes):
    assert outcomes[page] is None, outcomes[page]


def test_block_directives_are_read():
    text = (
        "a\n```python\nx = 1\n```\n<!-- test: continue -->\n```python\ny = x\n```\n\n"
        "<!-- test: skip cluster -->\n\n```python\nz\n```\n```bash\nls\n```\n"
    )
    assert [(d, c) for _, d, c in python_blocks(text)] == [
        ("", "x = 1"),
        ("continue", "y = x"),
        ("skip", "z"),
    ]


def test_pages_have_python_blocks():
    """Pages that show Python show runnable Python, and at most two blocks are skipped in all."""
    found = {name: python_blocks(p.read_text()) for name, p in zip(NAMES, PAGES)}
    for page in ("README.md", "docs/getting-started.md", "docs/write-your-own/algorithm.md"):
        assert found[page] and any(d != "skip" for _, d, _ in found[page]), page
    skipped = [(p, line) for p, blocks in found.items() for line, d, _ in blocks if d == "skip"]
    assert len(skipped) <= 2, skipped


# ------------------------------------------------------------------------- the API reference


def public_names() -> list[tuple[str, str]]:
    """``(module, name)`` for every name in ``__all__`` of fedsa_jax and its public modules."""
    package = Path(fj.__file__).parent
    modules = ["fedsa_jax"] + [m.name for m in pkgutil.walk_packages([str(package)], prefix="fedsa_jax.")]
    public = [
        m
        for m in modules
        if not any(p.startswith("_") for p in m.split(".")) and not m.startswith("fedsa_jax.cli")
    ]
    return [(m, n) for m in sorted(public) for n in importlib.import_module(m).__all__]


def resolve(path: str):
    """The object a ``::: dotted.path`` directive renders (the longest importable module prefix,
    then attributes)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def documented(pages) -> set[tuple[str, int]]:
    """``(name, id(object))`` of every object rendered by a ``:::`` directive of the pages."""
    found = set()
    for page in pages:
        for path in re.findall(r"^::: *([\w.]+)", page.read_text(), re.M):
            found.add((path.rsplit(".", 1)[-1], id(resolve(path))))
    return found


def missing_from_reference(pages) -> list[str]:
    found = documented(pages)
    missing = []
    for module, name in public_names():
        obj = getattr(importlib.import_module(module), name)
        if inspect.ismodule(obj):
            # a subpackage is covered by its own names (checked as a public module)
            continue
        if (name, id(obj)) not in found:
            missing.append(f"{module}.{name}")
    return missing


def test_every_public_name_is_in_the_api_reference():
    api = sorted((DOCS / "api").glob("*.md"))
    assert len(public_names()) > 250
    assert missing_from_reference(api) == []


def test_the_api_check_sees_a_removed_name(tmp_path):
    """Power: the same check fails when one directive (``fj.simulate``'s) is removed."""
    pages = []
    for page in sorted((DOCS / "api").glob("*.md")):
        copy = tmp_path / page.name
        copy.write_text(page.read_text().replace("::: fedsa_jax.simulate\n", ""))
        pages.append(copy)
    assert missing_from_reference(pages) == ["fedsa_jax.simulate"]


# ------------------------------------------------------------------------- the site offline


def site_config() -> dict:
    """mkdocs.yml, read without MkDocs (its Python tags, if any, left unresolved)."""
    yaml = pytest.importorskip("yaml")

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def network_urls(config: dict) -> list[str]:
    """Every script, stylesheet or font the site's configuration would fetch from the network."""
    assets = [*config.get("extra_javascript", []), *config.get("extra_css", [])]
    paths = [a["path"] if isinstance(a, dict) else a for a in assets]
    urls = [p for p in paths if re.match(r"^([a-z][a-z0-9+.-]*:)?//", p, re.I)]
    if config["theme"].get("font", {}) is not False:
        urls.append("theme.font (Google Fonts)")
    return urls


def test_the_site_loads_nothing_from_the_network():
    """The site renders its math offline: no script, stylesheet or font from a URL (a MathJax
    from a CDN showed raw ``\\(...\\)`` without a network), the formulas written as MathML when the
    site is built by a hook that the docs extra installs, display math scrolling when too wide."""
    config = site_config()
    assert network_urls(config) == []
    # power: the configuration as it was (MathJax from a CDN, the theme's web fonts) is caught
    before = {**config, "extra_javascript": ["javascripts/mathjax.js", "https://unpkg.com/mathjax@3/x.js"]}
    before["theme"] = {k: v for k, v in config["theme"].items() if k != "font"}
    assert network_urls(before) == ["https://unpkg.com/mathjax@3/x.js", "theme.font (Google Fonts)"]
    assert "docs/_ext/mathml.py" in config["hooks"]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.match(r"latex2mathml\b", requirement) for requirement in extras["docs"])
    css = "".join((DOCS / p).read_text() for p in config["extra_css"])
    assert re.search(r"div\.arithmatex\s*\{[^}]*overflow-x:\s*auto", css)


def test_the_math_hook_writes_mathml():
    """What arithmatex leaves (escaped TeX in its wrappers) becomes MathML, display math as a block,
    ``\\mathbb E`` as the Unicode letter (Chromium renders no ``mathvariant``)."""
    pytest.importorskip("latex2mathml")
    spec = importlib.util.spec_from_file_location("mathml_hook", DOCS / "_ext" / "mathml.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)

    class Page:
        class file:
            src_uri = "guide/theory.md"

    page = (
        '<p>with <span class="arithmatex">\\(a &lt; b\\)</span> and</p>\n'
        '<div class="arithmatex">\\[\n\\mathbb E[\\theta] = \\frac1N \\sum_c \\theta_c\n\\]</div>'
    )
    out = hook.on_page_content(page, page=Page)
    assert "\\(" not in out and "\\[" not in out
    assert out.count("<math") == 2 and 'display="block"' in out and 'display="inline"' in out
    assert "<mo>&#x0003C;</mo>" in out or "<mo>&lt;</mo>" in out
    assert "\U0001d53c" in out and "double-struck" not in out


# ------------------------------------------------------------------------- what the reference shows


def documented_objects():
    """``(dotted path, object)`` for every public name and the public methods of public classes."""
    seen, found = set(), []
    for module, name in public_names():
        obj = getattr(importlib.import_module(module), name)
        if id(obj) in seen or inspect.ismodule(obj):
            continue
        seen.add(id(obj))
        found.append((f"{module}.{name}", obj))
        if inspect.isclass(obj):
            found += [(f"{module}.{name}.{k}", v) for k, v in vars(obj).items() if not k.startswith("_")]
    return found


def unmatched_parameter_entries(rewrite) -> list[str]:
    """Args entries (after ``rewrite``, the reference's docstring extension) that name no parameter of
    the signature: the reference shows them without type and with "required" as their default."""
    entry = re.compile(r"^  (\*{0,2}\w+(?:, *\w+)*)(?: \([^)]*\))?:", re.M)
    unmatched = []
    for path, obj in documented_objects():
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            continue
        doc = rewrite(inspect.getdoc(obj) or "")
        args = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?|\n)*)", doc, re.M)
        names = entry.findall(args.group(1)) if args else []
        unmatched += [f"{path}: {n}" for n in names if n.lstrip("*") not in params]
    return unmatched


def test_the_api_reference_finds_every_documented_parameter():
    """An entry that describes several parameters at once (``record_every, metrics, ...: what to
    record``) matched no parameter, so ``fj.simulate``'s table showed "required" as the default of
    its optional keywords: the reference's extension (docs/_ext/roles.py) splits it into one entry
    per parameter, and then every entry of every public docstring names one parameter."""
    sys.path.insert(0, str(DOCS / "_ext"))
    pytest.importorskip("griffe")
    import roles

    assert unmatched_parameter_entries(roles.split_grouped_parameters) == []
    before = unmatched_parameter_entries(lambda doc: doc)  # power: the docstrings as written
    assert "fedsa_jax.simulate: record_every, metrics, quantiles, keep_seeds, on_record" in before
    text = "Args:\n  a, b: what\n    they are.\n  c: other\n\nReturns:\n  x, y: z"
    split = roles.split_grouped_parameters(text)
    assert split == (
        "Args:\n  a: what\n    they are.\n  b: described with ``a`` above.\n  c: other\n\nReturns:\n  x, y: z"
    )


def test_the_api_reference_sends_no_reader_to_a_private_module():
    """No public docstring names a private module or its members (``fedsa_jax.theory._agents``,
    ``fedsa_jax._io.DamagedFileError``): the reference has no page for them."""
    private = re.compile(r"fedsa_jax(?:\.\w+)*\._[a-z]\w*")
    docs = [(path, inspect.getdoc(obj) or "") for path, obj in documented_objects()]
    named = [(path, m) for path, doc in docs for m in private.findall(doc)]
    assert named == []
