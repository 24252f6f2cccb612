"""Every ``>>>`` example in the package's docstrings runs, and shows what it says it shows.

Examples that need what a test cannot have (a GPU, a user's storage) carry ``# doctest: +SKIP`` in the
source, where a reader sees it.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "optuna_memprune"
MODULES = sorted(
    ".".join(p.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
    for p in PKG.rglob("*.py")
    if ">>>" in p.read_text()
)


def test_the_package_has_examples():
    assert len(MODULES) >= 10


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, raise_on_error=False, verbose=False
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (run it with -s)"
