"""The layer rules of docs/ARCHITECTURE.md, checked on the source and in fresh interpreters.

Three rules, each on every module of the package: imports point down the layer order only (estimate and
monitor never import each other); no import cycle between the package's files, lazy imports inside
functions included; no module reads another module's ``_private`` names (Optuna's and multiprocessing's
private APIs are touched in exactly one audited module, ``_internals.py``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "optuna_memprune"

# The layers of docs/ARCHITECTURE.md, bottom first: a module may import its own layer and the ones below.
LAYERS = (
    ("units", "budget", "exceptions", "_extras", "_console", "procfs", "paths", "cgroups", "_cgroupfs", "_backoff"),
    ("estimate", "monitor"),
    ("ledger", "records", "storages", "_internals"),
    ("guard",),
    ("runner",),
    ("run", "report"),
    ("cli",),
)
# The one module allowed to touch Optuna's and multiprocessing's private names.
AUDITED = "_internals.py"
# Underscore names that are public API of the stdlib: os._exit, sys._getframe, namedtuple methods.
STDLIB_UNDERSCORE = {"_exit", "_getframe", "_current_frames", "_replace", "_asdict", "_fields", "_make"}


def _modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def _dotted(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _resolve(path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    """Absolute dotted names an import statement refers to (module and module.name candidates)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        package = _dotted(path).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [base] + [f"{base}.{a.name}" for a in node.names]


def _file_of(dotted: str) -> Path | None:
    if not dotted.startswith("optuna_memprune"):
        return None
    rel = Path(*dotted.split("."))
    for cand in (PKG.parent / rel.with_suffix(".py"), PKG.parent / rel / "__init__.py"):
        if cand.exists():
            return cand
    return None


def _edges(path: Path) -> set[Path]:
    """The package files this file imports, at module level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names = _resolve(path, node)
        base, rest = names[0], names[1:]
        hits = [f for f in map(_file_of, rest) if f is not None]  # `from pkg import submodule`
        if isinstance(node, ast.Import):
            hits = [f for f in map(_file_of, names) if f is not None]
        elif len(hits) < len(rest) and _file_of(base) is not None:
            hits.append(_file_of(base))  # some names are attributes of the module `base`
        out.update(h for h in hits if h != path)
    return out


def _layer(path: Path) -> int | None:
    rel = path.relative_to(PKG)
    head = rel.parts[0].removesuffix(".py")
    for i, names in enumerate(LAYERS):
        if head in names:
            return i
    return None


def test_every_module_has_a_layer():
    unknown = [str(p.relative_to(PKG)) for p in _modules() if p != PKG / "__init__.py" and _layer(p) is None]
    assert not unknown, f"modules outside docs/ARCHITECTURE.md's layers (add them to LAYERS and the doc): {unknown}"


def test_imports_point_down_the_layers():
    bad = []
    for path in _modules():
        if path == PKG / "__init__.py":
            continue  # the facade re-exports the public names of every layer
        mine = _layer(path)
        for target in _edges(path):
            # the facade (``optuna_memprune/__init__``) sits on top of every layer but the CLI's
            theirs = _layer(target) if target != PKG / "__init__.py" else len(LAYERS) - 1
            if theirs is None or theirs > mine:
                bad.append(f"{path.relative_to(PKG)} -> {target.relative_to(PKG)}")
    assert not bad, "imports that point up the layer order:\n" + "\n".join(bad)


def test_no_import_cycle_between_package_files():
    graph = {p: _edges(p) for p in _modules()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(str(p.relative_to(PKG)) for p in c) for c in cycles)


def _cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components of more than one file (Tarjan), each as a list."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on: set[Path] = set()
    out: list[list[Path]] = []

    def visit(v: Path) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _defined_names(tree: ast.AST) -> set[str]:
    """Every name a module defines itself: functions, classes, attributes it assigns, arguments."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def reach_ins(path: Path) -> list[str]:
    """The places where ``path`` reads a ``_private`` name that another module owns."""
    tree = ast.parse(path.read_text())
    own = _defined_names(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = _resolve(path, node)
            if isinstance(node, ast.Import):
                targets = names
            else:
                targets = [names[0]]
                for a, dotted in zip(node.names, names[1:]):
                    if _file_of(dotted) is not None:
                        targets.append(dotted)  # `from pkg import submodule`
                    elif _private(a.name):
                        out.append(f"line {node.lineno}: imports private name {a.name} from {names[0]}")
            for dotted in targets:
                f = _file_of(dotted)
                if f is None:
                    continue
                rel = f.relative_to(PKG)
                for i, part in enumerate(rel.parts):
                    # a private module is open to the files of the package that holds it (and its subpackages)
                    if _private(part.removesuffix(".py")) and PKG.joinpath(*rel.parts[:i]) not in path.parents:
                        out.append(f"line {node.lineno}: imports private module {dotted}")
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in STDLIB_UNDERSCORE:
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if node.attr in own:
                continue
            out.append(f"line {node.lineno}: reads .{node.attr}")
    return out


def test_no_module_reads_another_modules_private_names():
    bad = []
    for path in _modules():
        if path.relative_to(PKG).as_posix() == AUDITED:
            continue
        bad += [f"{path.relative_to(PKG)} {r}" for r in reach_ins(path)]
    assert not bad, "private reach-ins (give the shared thing a public name in its own module):\n" + "\n".join(bad)


def test_the_rules_catch_what_they_are_for(tmp_path):
    """The checks themselves: a reach-in, an upward import and a cycle written on purpose are found."""
    probe = PKG / "estimate" / "zz_layer_probe.py"
    probe2 = PKG / "estimate" / "zz_layer_probe2.py"
    try:
        probe.write_text(
            "from ..guard import MemoryGuard\nfrom . import zz_layer_probe2\ndef f(study):\n    return study._storage\n"
        )
        probe2.write_text("def g():\n    from . import zz_layer_probe\n")
        assert any("_storage" in r for r in reach_ins(probe))
        graph = {p: _edges(p) for p in (probe, probe2)}
        assert _cycles(graph) == [sorted([probe, probe2])]
        assert _layer(probe) == 1 and any(_layer(t) == 3 for t in _edges(probe))
    finally:
        probe.unlink()
        probe2.unlink()


def test_import_optuna_memprune_loads_no_torch_pynvml_or_plotly():
    code = (
        "import sys, optuna_memprune, optuna_memprune.estimate, optuna_memprune.monitor; "
        "print(sorted(m for m in ('torch', 'pynvml', 'plotly') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_estimate_and_monitor_never_import_each_other_or_optuna():
    for layer, banned in (
        ("estimate", ("optuna", "psutil", "monitor", "guard", "ledger", "report")),
        ("monitor", ("optuna", "torch", "estimate", "guard", "ledger", "report")),
    ):
        for path in (PKG / layer).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for name in _resolve(path, node):
                        parts = name.split(".")
                        assert not any(p in banned for p in parts if p), f"{path.relative_to(PKG)} imports {name}"


def test_architecture_doc_names_every_layer_module():
    doc = (PKG.parent / "docs" / "ARCHITECTURE.md").read_text()
    missing = [
        f"{n}"
        for layer in LAYERS
        for n in layer
        if (PKG / f"{n}.py").exists() or (PKG / n).is_dir()
        if f"`{n}.py`" not in doc and f"`{n}/`" not in doc
    ]
    assert not missing, f"docs/ARCHITECTURE.md does not name: {missing}"


def test_every_module_is_named_in_the_architecture() -> None:
    """docs/ARCHITECTURE.md names every file of the package (a package by its folder), so a reader finds
    where each piece lives; a new module without its line fails here."""
    arch = (PKG.parent / "docs" / "ARCHITECTURE.md").read_text()
    missing = []
    for path in _modules():
        if path.name == "__init__.py":
            if path.parent != PKG and f"{path.parent.name}/" not in arch:
                missing.append(f"{path.parent.relative_to(PKG.parent)}/")
        elif path.name not in arch:
            missing.append(str(path.relative_to(PKG.parent)))
    assert missing == [], f"not named in docs/ARCHITECTURE.md: {missing}"


def test_no_module_is_over_the_architectures_line_limit() -> None:
    """docs/ARCHITECTURE.md's convention: no file of the package over 450 lines (a file that grows past it
    holds two things; split it where they part)."""
    limit = 450
    arch = (PKG.parent / "docs" / "ARCHITECTURE.md").read_text()
    assert f"over about {limit} lines" in arch  # the rule this test checks is the one the doc states
    long = {str(p.relative_to(PKG)): n for p in _modules() if (n := len(p.read_text().splitlines())) > limit}
    assert long == {}, f"files over {limit} lines: {long}"
