"""Calibration and the process estimator, checked against real fresh processes on this host."""

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optuna_memprune.estimate import baselines, calibration, process
from optuna_memprune.exceptions import CalibrationError


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# A small conv net, as the stack probe trains: a convolution maps oneDNN's kernels, library pages an MLP never
# touches (8 MiB measured here). Against an MLP-only program the baseline is high by them: 4% here, 7.5% in one
# CI run whose freshly installed libraries all sat in the page cache; that side is checked below as well.
REAL_TRAINING = """
    import json, torch
    torch.set_num_threads({threads})
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 5), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(6 * 28 * 28, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(5):
        net(torch.randn(32, 3, 32, 32)).square().mean().backward(); opt.step(); opt.zero_grad()
    a = torch.ones(256, 256); (a @ a).sum()
    st = dict(l.split(":", 1) for l in open("/proc/self/status"))
    print(json.dumps({{"hwm": int(st["VmHWM"].split()[0]) * 1024, "threads": int(st["Threads"])}}))
"""

MLP_TRAINING = REAL_TRAINING.replace(
    "torch.nn.Conv2d(3, 6, 5), torch.nn.ReLU(), torch.nn.Flatten(),", "torch.nn.Flatten(),"
).replace("6 * 28 * 28", "3 * 32 * 32")


@pytest.fixture(scope="module")
def nearby_cache(tmp_path_factory):
    """A calibration cache of these tests alone, empty until the first of them measures the torch stack."""
    return tmp_path_factory.mktemp("nearby-cache")


@pytest.mark.parametrize("threads", [1, 3])
def test_process_baseline_matches_a_real_small_training_process(threads, nearby_cache, monkeypatch):
    # Calibrated in this module, next to the real runs (the first of the two measures it): a cache filled
    # earlier in the suite was measured under another page-cache state (in one CI run 402 MiB against a real
    # 365 MiB; staleness is issue 13's recheck).
    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", str(nearby_cache))
    fp = process("torch", torch_threads=threads)
    real = _run(REAL_TRAINING.format(threads=threads))
    # The baseline is mostly file-backed library pages, whose RSS follows the page cache's state: two
    # identical fresh venvs measured 225 MB and 260 MB for `import torch`. Hence 7.5%, not 5%.
    assert abs(fp.ram - real["hwm"]) / real["hwm"] < 0.075, (fp.table(), real)
    assert abs(fp.threads - real["threads"]) <= 1, (fp.table(), real)
    mlp = _run(MLP_TRAINING.format(threads=threads))
    assert fp.ram > 0.97 * mlp["hwm"], (fp.table(), mlp)  # never low for a program that maps less


def test_more_torch_threads_predict_more_os_threads():
    assert process("torch", torch_threads=8).threads > process("torch", torch_threads=1).threads


def test_calibration_is_cached_per_versions_and_survives_a_corrupt_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", str(tmp_path))
    cal = calibration.load()
    assert cal.path.parent == tmp_path and calibration._key(calibration.versions()) in cal.path.name
    base = cal.stack(())
    assert 1_000_000 < base.ram < 100_000_000  # a bare interpreter: a few MB to tens of MB
    assert json.loads(cal.path.read_text())["stacks"]
    mtime = cal.path.stat().st_mtime_ns
    assert calibration.load().stack(()) == base and cal.path.stat().st_mtime_ns == mtime  # no re-measure
    cal.path.write_text("{ not json")
    calibration._CURRENT = None
    again = calibration.load().stack(())
    assert abs(again.ram - base.ram) < 0.5 * base.ram  # measured anew, not crashed


def test_a_failing_probe_raises_calibration_error_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", str(tmp_path))
    with pytest.raises(CalibrationError, match="no_such_module_xyz"):
        calibration.load().stack(("no_such_module_xyz",))


@pytest.mark.parametrize(
    "kwargs,word",
    [
        ({"stack": "tensorflow"}, "stack"),
        ({"torch_threads": 0}, "torch_threads"),
        ({"extra_threads": -1}, "extra_threads"),
        ({"torch_threads": 2**23}, "torch_threads .*PID_MAX_LIMIT"),
    ],
)
def test_process_rejects_bad_input_naming_it(kwargs, word):
    with pytest.raises(ValueError, match=word):
        process(**kwargs)


PROBES = Path(calibration.__file__).parent / "probes"


def test_probe_modules_import_only_the_standard_library_and_procfs_at_module_level():
    """What a probe loads before it measures is the stack it was asked about: its own module level imports
    the standard library, the package's /proc reader and the probes' shared helpers only."""
    allowed_relative = {"procfs", None}  # ``from ...procfs import``, ``from . import``
    for path in sorted(PROBES.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
                assert all(n in sys.stdlib_module_names for n in names), (path.name, names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    assert node.module in allowed_relative, (path.name, node.module)
                else:
                    top = node.module.split(".")[0]
                    assert top in sys.stdlib_module_names | {"__future__"}, (path.name, node.module)


def test_the_stack_probe_has_loaded_nothing_heavy_when_it_measures():
    code = textwrap.dedent("""
        import json, os, runpy, sys
        third_party = {"torch", "numpy", "optuna", "psutil", "sqlalchemy", "rich", "pynvml"}
        ours = ("optuna_memprune.monitor", "optuna_memprune.guard", "optuna_memprune.ledger",
                "optuna_memprune.estimate.calibration", "optuna_memprune.estimate.recipes",
                "optuna_memprune.estimate.torchnet")
        end = os._exit

        def loaded_then_end(code):  # the probe ends with os._exit right after its PROBE line
            print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in third_party or m.startswith(ours))))
            sys.stdout.flush()
            end(code)

        os._exit = loaded_then_end
        sys.argv = ["probe", json.dumps({"imports": [], "train": False, "threads": 1})]
        runpy.run_module("optuna_memprune.estimate.probes.stack", run_name="__main__")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    probe_line, loaded = out.strip().splitlines()
    assert probe_line.startswith("PROBE") and json.loads(loaded) == []


def test_a_recipes_versions_key_its_entries(tmp_path, monkeypatch):
    """An entry asked for with ``versioned`` libraries is measured anew when one of their versions changes;
    the file (keyed by python, torch, numpy) and the other entries stay."""
    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", str(tmp_path))
    cal = calibration.load()
    plain = cal.stack(())
    keyed = cal.stack((), versioned=("pytest",))
    assert len(cal.data["stacks"]) == 2 and abs(keyed.ram - plain.ram) < 0.5 * plain.ram
    real = calibration.metadata.version
    monkeypatch.setattr(calibration.metadata, "version", lambda d: "99.0" if d == "pytest" else real(d))
    assert calibration.load().path == cal.path  # not a file-level key
    cal.stack((), versioned=("pytest",))
    cal.stack(())
    assert len(cal.data["stacks"]) == 3  # only the versioned entry was measured again


def test_kernel_probe_fits_the_rules_of_torchnets_workspace_table(tmp_path, monkeypatch):
    from optuna_memprune.estimate.torchnet.workspaces import WORKSPACE_RULES, channel_block

    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", str(tmp_path))
    kernels = calibration.load().cpu_kernels()
    raw = json.loads(calibration.load().path.read_text())["cpu_kernels"]
    assert "error" not in raw, raw
    assert kernels.measured and kernels.rules == WORKSPACE_RULES and kernels.block == channel_block()
    assert len(raw["rows"]) == 2 * len(baselines.KERNEL_CONVS)
    assert all(0 <= c < 3 for c in kernels.coefficients) and kernels.coefficient("conv_fwd_out") > 0


def test_cuda_costs_without_a_gpu_keep_the_defaults_and_say_why(tmp_path, monkeypatch):
    from optuna_memprune.estimate import allocator

    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    cal = calibration.load()
    assert cal.cuda_costs(measure=False) is None  # never measured and not asked to: no probe
    costs = cal.cuda_costs()  # the real probe, on this host without a GPU
    assert not costs.measured and "CUDA" in costs.error
    assert (costs.context, costs.cublas_workspace) == (allocator.CUDA_CONTEXT_BYTES, allocator.CUBLAS_WORKSPACE_BYTES)
    raw = json.loads(cal.path.read_text())["cuda"]["LAZY"]
    assert "error" in raw and raw["measured_at"] > 0
    assert calibration.load().cuda_costs(measure=False) == costs  # kept: not probed again
