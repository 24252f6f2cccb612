"""Every GPU claim of the project checked on a CUDA host, in one command: VRAM predictions against real
training steps, cuDNN workspaces, the CUDA context, the caching allocator, and the guard on the GPU.

Rows (one printed line each; the whole result as JSON, ``--out``, default ``$OUT/gpu_check.json`` where
``OUT`` is set, else ``./gpu_check.json``):
- ``vram``: ``torch_training(..., device="cuda")`` against 4 real steps of the same network (torchvision
  ResNet101, VGG16, MobileNetV2, ConvNeXt-Tiny at 224x224; GPT-2 and OPT-125m from their configs, nothing
  downloaded, 128 tokens; the DQN and PPO networks of the project's studies on stacked Atari frames) at 3
  batch sizes, Adam and SGD, ``cudnn.benchmark`` off and on: ``max_memory_reserved`` (the headline error,
  prediction without the CUDA context), ``max_memory_allocated`` and NVML's per-process figure.
- ``cudnn``: the workspace per conv shape of the CNNs, benchmark off and on; ``context``: what lies
  outside the caching allocator after each first op (lazy and eager module loading); ``allocator``: the
  peak reserved across 4 steps.
- ``guard``: a VRAM budget breached in process and in process-per-trial ends ``stopped``; a real CUDA OOM
  ends PRUNED ``out_of_memory`` with a positive constraint and the next trial starts with the cache empty;
  the monitor's NVML reading against torch's; learned VRAM after its warm-up; the small-card sweep (a
  3.7 GiB budget, batch and env counts swept) with no trial over it.
Last lines: ``GPU_VRAM rows=<n> median_err=<x>% under=<u> max_err=<x>%`` and ``GPU_GUARD checks=<n>
passed=<p>``. Each check runs in its own process under a time limit: a failure is a row, never the end of
the run. Without CUDA it prints one line and exits 0.

Run on a GPU host: ``python scripts/gpu_check.py [--smoke] [--only guard|cuda|vram ...] [--out PATH]
[--budget-s 480]`` (``--only``: some groups, to split the run over two calls)
(``scripts/gpu_wheels.sh`` brings what a bare host lacks and prints the whole command).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _gpu import results, rows  # noqa: E402
from _gpu.isolate import run_many  # noqa: E402

# Time limits per check, seconds: a model's predictions (cold traces on the CPU) and its measured rows.
PREDICT_LIMIT_S = 240  # one model's cold traces (2 optimizers; batch-linear fits), on the CPU
VRAM_LIMIT_S, VRAM_SMOKE_LIMIT_S = 90, 45  # one model's measured rows (6 cases x 2 settings x 4 steps)
GUARD_LIMITS_S = {
    "breach_in_process": 60,
    "breach_per_process": 90,
    "cuda_oom": 60,
    "nvml_vs_torch": 45,
    "learned_vram": 90,
    "small_card": 150,
}
CUDA_LIMITS_S = {"cudnn": 90, "context": 45, "allocator": 60}
GROUPS = ("guard", "cuda", "vram")
PARALLEL = 4  # prediction jobs at a time (CPU only); everything that uses the GPU runs one at a time


def cuda_status() -> tuple[bool, str]:
    """(usable, one line saying what was found)."""
    try:
        import torch
    except ImportError as e:
        return False, f"GPU_CHECK no CUDA here: torch does not import ({e}); nothing measured"
    if not torch.cuda.is_available():
        return False, (
            f"GPU_CHECK no CUDA device here (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda or 'none'}): nothing measured"
        )
    return True, ""


def host_meta() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": props.name,
        "gpu_memory": props.total_memory,
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "host": platform.node(),
        "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", ""),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        meta["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as e:  # noqa: BLE001 - the meta only says so
        meta["driver"] = f"unknown ({type(e).__name__})"
    return meta


def calibrate():
    """This host's CUDA context and cuBLAS workspace, measured once (the calibration's probe) before any check
    runs: the predictions, traced in processes of their own, read them from the calibration cache."""
    from optuna_memprune.estimate.calibration import load

    return load().cuda_costs()


def plan(smoke: bool) -> dict[str, list[tuple[str, dict, float, str]]]:
    """The jobs ``(check, args, time limit, label)`` in their groups: the VRAM predictions (CPU only), the
    guard, the CUDA internals, the VRAM measurements (their predictions are added when known)."""
    limit = VRAM_SMOKE_LIMIT_S if smoke else VRAM_LIMIT_S
    groups = rows.by_model(rows.cases(smoke=smoke))
    predict = [
        ("predict", {"cases": [c.to_dict() for c in cs]}, PREDICT_LIMIT_S, f"predict {m}") for m, cs in groups.items()
    ]
    vram = [
        ("vram", {"cases": [c.to_dict() for c in cs], "benchmark": [False, True]}, limit, f"vram {m}")
        for m, cs in groups.items()
    ]
    cnns = [m for m, (fam, _) in rows.MODELS.items() if fam == "CNN"]
    cuda = [
        (
            "cudnn",
            {"models": cnns[:2] if smoke else cnns, "batch": 32, "max_shapes": 12 if smoke else 40},
            CUDA_LIMITS_S["cudnn"],
            "cudnn workspaces",
        ),
        ("context", {}, CUDA_LIMITS_S["context"], "context lazy"),
        ("context", {"loading": "EAGER"}, CUDA_LIMITS_S["context"], "context eager"),
    ]
    for case in (
        rows.VramCase("CNN", "ResNet101", 32, "Adam"),
        rows.VramCase("transformer", "openai-community/gpt2", 8, "Adam"),
    )[: 1 if smoke else 2]:
        cuda.append(("allocator", {"case": case.to_dict()}, CUDA_LIMITS_S["allocator"], f"allocator {case.key}"))
    guard = [
        (name, {"trials": 6} if smoke and name == "small_card" else {}, lim, f"guard {name}")
        for name, lim in GUARD_LIMITS_S.items()
    ]
    return {"predict": predict, "guard": guard, "cuda": cuda, "vram": vram}


def with_predictions(vram_jobs: list[tuple[str, dict, float, str]], predicted: list[dict]) -> list[tuple]:
    """The measurement jobs with each case's prediction (parts, or the reason there is none) in their args."""
    known = {r["key"]: r.get("parts", r.get("error")) for r in predicted if r.get("kind") == "prediction"}
    out = []
    for check, args, limit, label in vram_jobs:
        mine = {c_key: known[c_key] for c_key in (rows.VramCase(**c).key for c in args["cases"]) if c_key in known}
        out.append((check, {**args, "predictions": mine}, limit, label))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="JSON result path (default: $OUT/gpu_check.json)")
    ap.add_argument("--smoke", action="store_true", help="one batch and one optimizer per model, fewer shapes")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall-clock seconds for the whole run")
    ap.add_argument(
        "--only",
        choices=GROUPS,
        action="append",
        default=None,
        help="run only this group (repeatable): to split the run over two calls",
    )
    args = ap.parse_args(argv)
    only = tuple(args.only or GROUPS)
    if args.budget_s <= 0:
        ap.error(f"--budget-s must be a positive number of seconds, but got {args.budget_s}")
    usable, line = cuda_status()
    if not usable:
        print(line)
        return 0
    deadline = time.monotonic() + args.budget_s
    meta = host_meta()
    print(
        f"GPU {meta['gpu']} ({meta['gpu_memory'] / 2**30:.1f} GiB), driver {meta['driver']}, torch "
        f"{meta['torch']}, CUDA {meta['cuda']}, cuDNN {meta['cudnn']}, {meta['date']}",
        flush=True,
    )
    costs = calibrate()
    meta["calibrated_context"], meta["calibrated_cublas_workspace"] = costs.context, costs.cublas_workspace
    print(
        f"calibrated here: CUDA context {costs.context / 2**20:.0f} MiB, cuBLAS workspace "
        f"{costs.cublas_workspace / 2**20:.1f} MiB" + ("" if costs.measured else f" (defaults: {costs.error})"),
        flush=True,
    )
    jobs = plan(args.smoke)
    found: dict[str, list[dict]] = {"vram": [], "cuda": [], "guard": []}

    def show(group: str, got: list[list[dict]]) -> None:
        for batch in got:
            for row in batch:
                row.setdefault("kind", group)
                found[group].append(row)
                print(results.format_row(row), flush=True)

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp, ThreadPoolExecutor(1) as background:
        lock = str(Path(tmp) / "gpu.lock")
        # the predictions trace on the CPU while the guard and the CUDA checks have the GPU, one at a time
        predicting = background.submit(
            run_many, jobs["predict"] if "vram" in only else [], parallel=PARALLEL, lock=lock, deadline=deadline
        )
        for group in ("guard", "cuda"):
            if group in only:
                show(group, run_many(jobs[group], parallel=1, lock=lock, deadline=deadline))
        predicted = [row for batch in predicting.result() for row in batch]
        if "vram" in only:
            show("vram", [[row for row in predicted if row.get("ok") is False]])  # a prediction job's failure
            show("vram", run_many(with_predictions(jobs["vram"], predicted), parallel=1, lock=lock, deadline=deadline))
    for name, part in results.breakdown(found["vram"]).items():
        print(f"vram {name:<18} {results.vram_line(part).removeprefix('GPU_VRAM ')} failed={part['failed']}")
    result = results.build(meta, found["vram"], found["cuda"], found["guard"])
    path = results.write_json(result, args.out or results.default_out())
    print(f"result: {path}")
    for summary_line in result["summary"]["lines"]:
        print(summary_line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
