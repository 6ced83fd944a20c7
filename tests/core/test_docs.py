"""The docs say what running the code shows, and the API reference renders as Markdown.

The reference is built by mkdocstrings from the docstrings, which are
Markdown: a reST role (``:class:`X```) shows as raw text there, so none may
come back. The README's and the quick start's figures are checked by running
their snippets.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import inspect
import re
import sys
import time
import types
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from autoseq import signals
from autoseq.snowflake import decode

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("autoseq", "autoseq_django", "autoseq_mongoengine")
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|ref|doc):`")
PRIVATE_MODULE = re.compile(r"\bautoseq\w*(?:\.\w+)*\._[a-z]\w*")


def docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, docstring)`` of the module, every class and every function in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    nodes: list[Any] = [tree]
    nodes += [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    for node in nodes:
        text = ast.get_docstring(node, clean=False)
        if text:
            yield getattr(node, "lineno", 1), text


def test_no_docstring_has_a_raw_rest_role() -> None:
    """No docstring in the three packages uses a reST role: mkdocstrings would print it raw."""
    found = [
        f"{path.relative_to(ROOT)}:{line}: {ROLE.search(text).group(0)}"  # type: ignore[union-attr]
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, text in docstrings(path)
        if ROLE.search(text)
    ]
    assert found == []


def reference_targets() -> list[str]:
    """The objects the API reference pages render (``::: path`` lines)."""
    return [
        line.split(":::", 1)[1].strip()
        for page in sorted((ROOT / "docs" / "reference").glob("*.md"))
        for line in page.read_text().splitlines()
        if line.startswith(":::")
    ]


def resolve(path: str) -> Any:
    """Import ``path``: a module, or an attribute of one."""
    module, _, name = path.rpartition(".")
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        return getattr(importlib.import_module(module), name)


def rendered_docstrings(obj: Any) -> Iterator[tuple[str, str]]:
    """The docstrings a reference entry shows: the object's and its public members'."""
    yield getattr(obj, "__name__", repr(obj)), inspect.getdoc(obj) or ""
    if inspect.ismodule(obj):
        names = getattr(obj, "__all__", None) or [n for n in vars(obj) if not n.startswith("_")]
        members = [getattr(obj, name) for name in names if hasattr(obj, name)]
        members = [m for m in members if getattr(m, "__module__", None) == obj.__name__]
    elif inspect.isclass(obj):
        members = [m for n, m in vars(obj).items() if not n.startswith("_") and callable(m)]
    else:
        members = []
    for member in members:
        yield getattr(member, "__qualname__", repr(member)), inspect.getdoc(member) or ""


def test_the_reference_renders_no_private_module() -> None:
    """The API reference neither renders a private module nor names one in what it shows."""
    pytest.importorskip("django")
    pytest.importorskip("mongoengine")
    targets = reference_targets()
    assert targets, "no ::: lines found in docs/reference"
    assert [t for t in targets if any(part.startswith("_") for part in t.split("."))] == []
    named = [
        f"{target} ({where}): {match}"
        for target in targets
        for where, text in rendered_docstrings(resolve(target))
        for match in PRIVATE_MODULE.findall(text)
    ]
    assert named == []


def headings(page: Path) -> list[str]:
    """The Markdown headings of ``page``, code blocks left out."""
    found, fenced = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.append(line)
    return found


PAGES = [pytest.param(page.name, id=page.name) for page in sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("name", PAGES)
def test_every_page_has_one_title(name: str) -> None:
    """A page opens with its one ``# title``; the theme would otherwise add a second one."""
    found = headings(ROOT / "docs" / name)
    assert found, f"{name} has no heading"
    assert found[0].startswith("# ")
    assert [h for h in found if h.startswith("# ")] == [found[0]]


def test_the_readme_snowflake_id_decodes_to_what_it_says() -> None:
    """The README's sample id decodes to the time, worker and sequence shown beside it."""
    readme = (ROOT / "README.md").read_text()
    sample = re.search(r"ids\.next\(\)\s+# (\d+)", readme)
    shown = re.search(
        r"ids\.decode\((\d+)\)\s+# timestamp (\S+ \S+) UTC, worker (\d+), sequence (\d+)", readme
    )
    assert sample, "the README's snowflake sample is not where this test looks"
    assert shown, "the README's decode() line does not show the parts"
    assert shown.group(1) == sample.group(1)
    parts = decode(int(sample.group(1)))
    assert parts.timestamp.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] == shown.group(2)
    assert (parts.worker, parts.sequence) == (int(shown.group(3)), int(shown.group(4)))
    assert parts.timestamp <= datetime.now(UTC)  # made in the past, not in 2028


QUICK_STARTS = ["README.md", "docs/quickstart.md", "docs/sqlalchemy.md"]
ADD_ALL = "session.add_all([Order() for _ in range(10_000)])"


def sqlalchemy_snippet(page: str) -> tuple[str, int]:
    """The SQLAlchemy quick start of ``page`` and the reservations its comment announces."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)
    code = next(block for block in blocks if ADD_ALL in block)
    stated = re.search(re.escape(ADD_ALL) + r"\s+# (\d+) reservations", code)
    assert stated, f"{page}: the add_all line does not say how many reservations it makes"
    return code, int(stated.group(1))


@pytest.mark.parametrize("page", QUICK_STARTS)
def test_the_sqlalchemy_quick_start_makes_the_reservations_it_says(
    page: str, tmp_path: Path
) -> None:
    """Run on SQLite, the quick start reserves as many blocks as its comment says."""
    from sqlalchemy.orm import Session

    from autoseq.sqlalchemy import close_registries, get_registry, uninstall

    code, stated = sqlalchemy_snippet(page)
    code = re.sub(
        r'create_engine\("[^"]+"\)', f'create_engine("sqlite:///{tmp_path}/shop.db")', code
    )
    seen: list[dict[str, Any]] = []

    def receive(_sender: object, **kwargs: Any) -> None:
        seen.append(kwargs)

    signals.block_reserved.connect(receive, weak=False)
    module = types.ModuleType("quick_start")  # SQLAlchemy reads the annotations from its module
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    try:
        exec(compile(code, page, "exec"), namespace)
        registry = get_registry(namespace["engine"])
        deadline = time.monotonic() + 10
        while any(s["loading"] for s in registry.stats().values()):  # prefetches in flight
            assert time.monotonic() < deadline, "a prefetch never finished"
            time.sleep(0.01)
    finally:
        signals.block_reserved.disconnect(receive)
        del sys.modules[module.__name__]
        uninstall(Session)
        close_registries()
        if "engine" in namespace:
            namespace["engine"].dispose()
    assert len(seen) == stated, [(s["name"], s["prefetch"]) for s in seen]


#: A test named in docs/guarantees.md: ``tests/x/test_a.py::test_b``, a bare
#: ``test_a.py`` (in the folder of the last path on the line, else
#: ``tests/reliability/``, as the first table says), ``::test_c`` (in the file or
#: class named before it), or a contract class's test ``StoreContract::test_d``.
TEST_REFERENCE = re.compile(
    r"^(?:(?P<file>(?:[\w/]+/)?test_\w+\.py|autoseq/testing/contract\.py)|(?P<cls>[A-Z]\w+))?"
    r"(?P<names>(?:::[\w*]+)*)$"
)


def definitions(path: Path) -> set[str]:
    """The module's functions and classes, and each class's methods as ``Class::method``."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        if isinstance(node, ast.ClassDef):
            found |= {
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
    return found


def missing_tests(text: str) -> list[str]:
    """Every test ``text`` names that is not there (file, function or method), by line."""
    contract = ROOT / "autoseq" / "testing" / "contract.py"
    missing = []
    for number, line in enumerate(text.splitlines(), 1):
        folder, path, scope = "tests/reliability", None, ""
        for span in re.findall(r"`([^`\s]+)`", line):
            match = TEST_REFERENCE.match(span)
            if match is None or not (match["file"] or match["names"]):
                continue
            if match["file"]:
                relative = match["file"]
                if "/" in relative:
                    folder = relative.rpartition("/")[0]
                else:
                    relative = f"{folder}/{relative}"
                path, scope = ROOT / relative, ""
                if not path.is_file():
                    missing.append(f"{number}: {relative}")
                    path = None
                    continue
            if match["cls"]:
                path, scope = contract, ""
            names = match["names"].split("::")[1:]
            for name in [match["cls"], *names] if match["cls"] else names:
                if name[:1].isupper():
                    scope = f"{name}::"
                    continue
                wanted = scope + name
                if path is None or not fnmatch.filter(definitions(path), wanted):
                    where = path.relative_to(ROOT) if path else "no file before it"
                    missing.append(f"{number}: {span} ({where})")
    return missing


def test_every_test_the_guarantees_name_exists() -> None:
    """Each file, function and contract method docs/guarantees.md names as a proof is there."""
    assert missing_tests((ROOT / "docs" / "guarantees.md").read_text()) == []
    assert missing_tests("`tests/core/test_docs.py::test_no_such_test`, `::test_gone`") == [
        "1: tests/core/test_docs.py::test_no_such_test (tests/core/test_docs.py)",
        "1: ::test_gone (tests/core/test_docs.py)",
    ]
    assert missing_tests("`test_crash.py`, `tests/test_serving.py`") == ["1: tests/test_serving.py"]
    assert missing_tests("`MaintenanceContract::test_sync_*`, `::test_none`") == [
        "1: ::test_none (autoseq/testing/contract.py)"
    ]
