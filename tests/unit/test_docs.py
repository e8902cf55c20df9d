"""The docs name only what exists: README.md and docs/*.md checked against the checkout.

- every relative path they mention (``eagletree/...``, ``app/...`` and the other package
  folders, ``benchmarks/``, ``scripts/``, ``examples/``, ``docs/``, ``tests/``) is a file or folder,
  and every module or script their code names without a folder is somewhere in the checkout;
- every markdown link points at a file, and its ``#anchor`` at a heading of that file; the
  README links every doc;
- every command their code shows — ``eagletree …``, ``python -m benchmarks.… / eagletree.…``,
  ``bash scripts/gpu.sh bench|cli|ab|real-pair …`` — answers ``--help`` with status 0 and lists
  each ``--flag`` it is shown with (run in this process: argparse exits before any work);
- every ``Class.attribute`` and ``eagletree.dotted.name`` in their code is defined in
  ``eagletree/`` (read from the source, not imported).

docs/log/ is a dated record of past runs, whose commands were those of their day: not checked.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.unit.docs_code import FENCED, ROOT, code_of, commands_of, help_of

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGE = ROOT / "eagletree"

TOP = "eagletree|benchmarks|scripts|examples|docs|tests|app|adapters|domain|ports|config"
PATH = re.compile(rf"(?<![\w./$<>{{}}~-])(?:{TOP})/[\w./-]*[\w/]")
BRACES = re.compile(rf"((?:{TOP})/[\w./-]*)\{{([^{{}}]*)\}}([\w./-]*)")  # a/{b,c}.py
LINK = re.compile(r"\[[^\[\]]*\]\(([^)\s]+)\)")
SOURCE_NAME = re.compile(r"(?<![\w/.-])(\w+\.(?:py|sh))\b")
ATTRIBUTE = re.compile(r"(?<![\w.])([A-Z]\w*)\.([a-z_]\w*)\b(?!\.)")
DOTTED = re.compile(r"(?<![\w./])(eagletree(?:\.\w+)+)")


def relative_paths(text: str) -> list[str]:
    text = LINK.sub(" ", text)  # links are checked on their own, relative to their file
    text = BRACES.sub(
        lambda m: " ".join(m[1] + alt.strip() + m[3] for alt in m[2].split(",")), text
    )
    return [match.rstrip("/.") for match in PATH.findall(text)]


def path_exists(path: str, doc: Path) -> bool:
    return any((base / path).exists() for base in (ROOT, PACKAGE, doc.parent))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCED.sub("", doc.read_text("utf-8")), re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


@cache
def source_index() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """({class name: the attributes its bodies define}, {class name: its bases' names})."""
    members: dict[str, set[str]] = {}
    bases: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = members.setdefault(node.name, set())
                bases.setdefault(node.name, []).extend(
                    b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases
                )
                for item in node.body:
                    names |= defined_names(item)
                names |= {  # instance attributes: self.name = … in any method
                    target.attr
                    for sub in ast.walk(node)
                    for target in getattr(sub, "targets", [getattr(sub, "target", None)])
                    if isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                }
    return members, bases


def defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.If | ast.Try):
        return set().union(*(defined_names(n) for n in node.body), set())
    return set()


def has_attribute(cls: str, attribute: str, seen: frozenset[str] = frozenset()) -> bool:
    members, bases = source_index()
    if attribute in members.get(cls, set()):
        return True
    return any(
        has_attribute(b, attribute, seen | {cls}) for b in bases.get(cls, []) if b not in seen
    )


def dotted_name_exists(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.exists():
            rest = parts[cut:]
            if not rest:
                return True
            tree = ast.parse(module.read_text("utf-8"))  # names it defines or imports
            top = set().union(*(defined_names(node) for node in tree.body))
            if parts[:cut] == ["eagletree"]:
                top |= set(eagletree_exports())
            return rest[0] in top and (len(rest) == 1 or has_attribute(rest[0], rest[1]))
    return False


@cache
def logger_names() -> frozenset[str]:
    """The names eagletree/ gives its loggers, which docs name as dotted names too."""
    pattern = re.compile(r"getLogger\(\"([\w.]+)\"\)")
    return frozenset(
        n for p in PACKAGE.rglob("*.py") for n in pattern.findall(p.read_text("utf-8"))
    )


def eagletree_exports() -> list[str]:
    import eagletree

    return list(eagletree.__all__)


@cache
def source_file_names() -> frozenset[str]:
    tops = ("eagletree", "benchmarks", "tests", "scripts", "examples")
    return frozenset(p.name for top in tops for p in (ROOT / top).rglob("*"))


def doc_id(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_relative_path_exists(doc: Path) -> None:
    missing = [p for p in relative_paths(doc.read_text("utf-8")) if not path_exists(p, doc)]
    assert not missing, f"{doc_id(doc)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_named_source_file_exists(doc: Path) -> None:
    """A module or script named without its folder (``startup.py``) is somewhere in the
    checkout; files the code writes (``config.json``, ``report.md``) are not checked."""
    named = {n for code in code_of(doc.read_text("utf-8")) for n in SOURCE_NAME.findall(code)}
    missing = sorted(named - source_file_names())
    assert not missing, f"{doc_id(doc)} names source files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_link_and_anchor_resolves(doc: Path) -> None:
    broken = []
    for target in LINK.findall(FENCED.sub("", doc.read_text("utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(target)
    assert not broken, f"{doc_id(doc)} links to what does not exist: {broken}"


def test_the_readme_links_every_doc() -> None:
    linked = {(ROOT / target).resolve() for target in LINK.findall(DOCS[0].read_text("utf-8"))}
    unlisted = [doc_id(doc) for doc in DOCS[1:] if doc.resolve() not in linked]
    assert not unlisted, f"README.md's list of documentation leaves out {unlisted}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_command_answers_help_and_knows_its_flags(doc: Path) -> None:
    problems = []
    for shown in dict.fromkeys(commands_of(doc.read_text("utf-8"))):
        if re.search(r"\b[A-Z]{2,}\b", shown.name):  # a placeholder: benchmarks.NAME
            continue
        status, text = help_of(shown.kind, shown.name, shown.words)
        if status != 0:
            problems.append(f"`{shown}`: --help ended with {status}")
            continue
        unknown = [f for f in shown.flags if not re.search(rf"(?<![\w-]){f}(?![\w-])", text)]
        if unknown:
            problems.append(f"`{shown}`: no {', '.join(unknown)} in its --help")
    assert not problems, f"{doc_id(doc)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_named_class_attribute_and_dotted_name_is_defined(doc: Path) -> None:
    members, _ = source_index()
    undefined = []
    for code in code_of(doc.read_text("utf-8")):
        for cls, attribute in ATTRIBUTE.findall(code):
            if cls in members and not has_attribute(cls, attribute):
                undefined.append(f"{cls}.{attribute}")
        undefined += [
            name
            for name in DOTTED.findall(code)
            if not dotted_name_exists(name) and name not in logger_names()
        ]
    assert not undefined, f"{doc_id(doc)} names what eagletree/ does not define: {undefined}"
