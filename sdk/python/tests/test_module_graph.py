"""The SDK's modules import one another one way, as the Rust crates' modules do
(crates/archcheck/tests/module_graph.rs): no circle of imports between the modules of
`src/branchbox`. A circle means two modules can only be understood and moved together.

Edges are every import that runs: `import branchbox.x`, `from . import x`, `from .x import y`,
at module level, in a class body or inside a function (an import put off into a function to
dodge a circle at load time is still the circle). Not edges: imports under `if TYPE_CHECKING:`
(only a type checker runs them, for annotations), and a package's `__init__` importing its own
submodules, which is containment, as `mod x;` and `pub use x::Y` are in Rust.

Needs no service: it reads the sources only.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set

PKG = Path(__file__).resolve().parents[1] / "src" / "branchbox"


def _name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(body: List[ast.stmt]) -> Iterator[ast.stmt]:
    """The import statements of `body` and every block in it, but those under `if TYPE_CHECKING:`."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, None) or ():
                    if isinstance(child, ast.stmt):
                        yield from _imports([child])
                    else:  # an except handler or a match case: its own statements
                        yield from _imports(child.body)


def module_graph(root: Path) -> Dict[str, Set[str]]:
    """Module -> the modules of the same package it imports."""
    files = {_name(root, p): p for p in sorted(root.rglob("*.py"))}
    graph: Dict[str, Set[str]] = {}
    for module, path in files.items():
        is_pkg = path.name == "__init__.py"
        package = module if is_pkg else module.rpartition(".")[0]
        edges: Set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path)).body):
            named: List[str] = []
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                named = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            for name in named:
                # The longest prefix that is one of the package's modules.
                parts = name.split(".")
                target = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in files), None)
                if target is None or target == module:
                    continue
                if is_pkg and target.startswith(module + "."):
                    continue  # a package naming its own submodules: containment
                edges.add(target)
        graph[module] = edges
    return graph


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The groups of two or more modules that each reach every other one."""
    reach: Dict[str, Set[str]] = {}
    for start in graph:
        seen: Set[str] = set()
        todo = list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        reach[start] = seen
    out: List[List[str]] = []
    done: Set[str] = set()
    for m in sorted(graph):
        if m in done or m not in reach[m]:
            continue
        group = sorted(n for n in reach[m] if m in reach[n])
        done.update(group)
        out.append(group)
    return out


def describe(graph: Dict[str, Set[str]], group: List[str]) -> str:
    edges = [f"{a} -> {b}" for a in group for b in sorted(graph[a]) if b in group]
    return f"{len(group)} modules in a circle: {group}; edges: {', '.join(edges)}"


def test_a_circle_is_found_through_deferred_imports_and_type_only_ones_are_not_edges(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import A\nfrom .sub import S\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nfrom .b import B\nif TYPE_CHECKING:\n    from .c import C\n"
        "class A:\n    from . import sub\n"
    )
    (pkg / "b.py").write_text("import pkg.sub.s\n")
    (pkg / "c.py").write_text("def f():\n    try:\n        pass\n    except ImportError:\n        from . import a\n")
    (pkg / "sub" / "__init__.py").write_text("from .s import S\n")
    # Put off into a function, the import back to `a` still closes the circle.
    (pkg / "sub" / "s.py").write_text("S = 1\ndef g():\n    from ..a import A\n    return A\n")
    graph = module_graph(pkg)
    assert graph["pkg"] == set(), "a package's own submodules are containment"
    assert graph["pkg.a"] == {"pkg.b", "pkg.sub"}
    assert graph["pkg.b"] == {"pkg.sub.s"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.sub.s"] == {"pkg.a"}
    found = circles(graph)
    assert found == [["pkg.a", "pkg.b", "pkg.sub.s"]]
    assert describe(graph, found[0]) == (
        "3 modules in a circle: ['pkg.a', 'pkg.b', 'pkg.sub.s']; "
        "edges: pkg.a -> pkg.b, pkg.b -> pkg.sub.s, pkg.sub.s -> pkg.a"
    )


def test_the_sdk_modules_import_one_another_one_way() -> None:
    graph = module_graph(PKG)
    assert len(graph) > 10, f"the SDK's modules were not found under {PKG}"
    found = circles(graph)
    assert not found, "import circles in sdk/python/src/branchbox:\n" + "\n".join(describe(graph, g) for g in found)
