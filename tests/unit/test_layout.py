"""The house rules of the tree (ARCHITECTURE.md), read from the source with `ast`:

- no import circle among the product's modules (`schemas`, `engine`, `consumer`), counting module-level
  imports and those under `if TYPE_CHECKING:` (an import inside a function is a lazy one and may point
  anywhere the rules below allow);
- dependencies point one way: `schemas` <- `engine` <- `consumer`; `engine` never imports aiokafka;
- the product imports nothing of `bench`/`devtools` at module level (dev commands import them lazily);
- no product module over 350 lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("schemas", "engine", "consumer")
MAX_LINES = 350


@dataclass(frozen=True, slots=True)
class Import:
    target: str
    lazy: bool  # inside a function body
    line: int
    typing_only: bool = False  # under `if TYPE_CHECKING:` (never executed)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _product_files() -> list[Path]:
    return sorted(p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py"))


MODULES = {_module_name(p): p for p in _product_files()}


def _imports(path: Path) -> Iterator[Import]:
    """Every import of `path`, resolved to the module it loads (`from a import b` is `a.b` when `a.b` is a
    module of the product, else `a`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]

    def visit(node: ast.AST, lazy: bool, typing: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            guarded = typing or (
                isinstance(child, ast.If)
                and isinstance(child.test, ast.Name)
                and child.test.id == "TYPE_CHECKING"
            )
            if isinstance(child, ast.Import):
                yield from (Import(a.name, lazy, child.lineno, typing) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*up, base] if base else up)
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    yield Import(full if full in MODULES else base, lazy, child.lineno, typing)
            yield from visit(child, inner, guarded)

    yield from visit(tree, False, False)


GRAPH = {name: [i for i in _imports(path)] for name, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself), by
    Tarjan's algorithm over the eager edges."""
    edges = {
        m: sorted({i.target for i in imps if not i.lazy and i.target in MODULES}) for m, imps in GRAPH.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges[v]:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


def test_the_graph_was_read() -> None:
    """The checks below see the real tree: the pipeline imports its stages, the runner the collate step."""
    assert "consumer.pipeline.emitter" in {i.target for i in GRAPH["consumer.pipeline.pipeline"]}
    assert "engine.batching.collate" in {i.target for i in GRAPH["engine.runner"]}


def test_no_import_circle() -> None:
    assert _cycles() == []


def test_the_cycle_finder_finds_one() -> None:
    """A circle planted in the graph is reported (the check above can fail)."""
    GRAPH["schemas.errors"].append(Import("schemas.systemone", False, 0))
    GRAPH["schemas.systemone"].append(Import("schemas.errors", False, 0))
    try:
        assert any({"schemas.errors", "schemas.systemone"} <= set(c) for c in _cycles())
    finally:
        GRAPH["schemas.errors"].pop()
        GRAPH["schemas.systemone"].pop()


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("schemas", ("engine", "consumer", "bench", "devtools", "torch", "aiokafka")),
        ("engine", ("consumer", "bench", "devtools", "aiokafka")),
    ],
)
def test_dependencies_point_one_way(package: str, forbidden: tuple[str, ...]) -> None:
    """Lazy imports count too: `engine` must work without the consumer and never load aiokafka."""
    wrong = [
        f"{m}:{i.line} imports {i.target}"
        for m, imps in GRAPH.items()
        if m.split(".")[0] == package
        for i in imps
        if i.target.split(".")[0] in forbidden
    ]
    assert wrong == []


def test_product_imports_no_dev_tool_at_module_level() -> None:
    """A dev tool is imported inside the dev command that needs it (or named for the type checker only)."""
    wrong = [
        f"{m}:{i.line} imports {i.target}"
        for m, imps in GRAPH.items()
        for i in imps
        if not i.lazy and not i.typing_only and i.target.split(".")[0] in ("bench", "devtools")
    ]
    assert wrong == []


def test_no_product_module_over_the_limit() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
