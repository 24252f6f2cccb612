"""The layer rules of DESIGN.md, checked on the source and in fresh interpreters."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "optuna_memprune"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def test_import_optuna_memprune_loads_no_torch_pynvml_or_plotly():
    code = ("import sys, optuna_memprune, optuna_memprune.estimate, optuna_memprune.monitor; "
            "print(sorted(m for m in ('torch', 'pynvml', 'plotly') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_estimate_and_monitor_never_import_each_other_or_optuna():
    for layer, banned in (("estimate", ("optuna", "psutil", "monitor", "guard", "ledger", "report")),
                          ("monitor", ("optuna", "torch", "estimate", "guard", "ledger", "report"))):
        for path in (PKG / layer).rglob("*.py"):
            for name in _imports(path):
                parts = name.lstrip(".").split(".")
                assert not any(p in banned for p in parts if p), f"{path.relative_to(PKG)} imports {name}"
