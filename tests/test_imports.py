"""No import cycle inside the package: every `from .x import` and
`import repro.x` edge, at module level or inside a function, over repro/ and kernels/."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def graph() -> dict[str, set[str]]:
    files = [p for pkg in ("repro", "kernels") for p in (ROOT / pkg).rglob("*.py")]
    mods = {_module(p): p for p in files}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and not m.startswith(t + "."):  # a package's own __init__ is not an edge back
                    edges[m].add(t)
    return edges


def cycles(edges) -> list[list[str]]:
    found, state = [], {}

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for t in sorted(edges[n]):
            if state.get(t) == 1:
                found.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[n] = 2
    for n in sorted(edges):
        if n not in state:
            visit(n, [])
    return found


def test_the_checker_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]


def test_cli_bench_hunt_have_no_cycle():
    c = [x for x in cycles(graph()) if {"repro.cli.app", "repro.job.run", "repro.bench.replay", "repro.search.hunt"} & set(x)]
    assert not c, c
    g = graph()
    assert "repro.cli.app" not in g["repro.search.hunt"] and "repro.cli.app" not in g["repro.bench.replay"]


def test_no_import_cycle_in_the_package():
    assert not cycles(graph()), cycles(graph())
