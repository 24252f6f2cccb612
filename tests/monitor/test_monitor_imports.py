"""The monitor's layer rules: no optuna, torch or estimate/guard; pynvml only when a GPU reading is asked
and NVML's library loads."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import optuna_memprune.monitor as monitor

PACKAGE = pathlib.Path(monitor.__file__).parent


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_import_loads_no_pynvml_torch_or_optuna() -> None:
    out = run(
        "import sys, optuna_memprune.monitor as m\n"
        "m.read_tree(); m.Monitor(gpu=None).start().stop()\n"
        "print(sorted(k for k in ('pynvml', 'torch', 'optuna') if k in sys.modules))"
    )
    assert out == "[]"


def test_pynvml_loads_when_a_gpu_reading_is_first_asked_where_nvml_loads() -> None:
    """Without the driver's NVML library pynvml (0.3-0.6 s of CPU to import) is never imported."""
    out = run(
        "import sys, optuna_memprune.monitor as m\n"
        "from optuna_memprune.monitor._nvml import nvml_library_loads\n"
        "before = 'pynvml' in sys.modules\n"
        "m.read_tree(gpu='auto')\n"
        "print(before, nvml_library_loads(), 'pynvml' in sys.modules)"
    )
    before, loads, loaded = out.split()
    assert before == "False" and loaded == loads


def test_sources_import_nothing_from_the_layers_above() -> None:
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            else:
                continue
            for name in names:
                top = name.lstrip(".").split(".")[0]
                assert top not in {"optuna", "torch", "pynvml"}, f"{path.name} imports {name}"
                assert not any(part in {"estimate", "guard", "ledger", "report"} for part in name.split(".")), (
                    f"{path.name} imports {name}"
                )
        assert tree.body and isinstance(tree.body[0], ast.Expr), f"{path.name} has no module docstring"
        doc = ast.get_docstring(tree) or ""
        assert len([line for line in doc.splitlines() if line.strip()]) == 2, f"{path.name}: two-line docstring"
