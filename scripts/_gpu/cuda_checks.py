"""The CUDA measurements of the GPU check: predicted vs real training steps, cuDNN workspaces per conv shape,
the CUDA context and lazily loaded modules, the caching allocator across steps.

Runs only inside a check's own process on a CUDA host (``_gpu.worker``); owns how a real step is run and
read (``max_memory_reserved``, ``max_memory_allocated``, NVML's per-process figure); knows nothing of the
guard or of scoring beyond ``results.score_vram``.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
from typing import Any, Callable

from .isolate import LOCK_ENV
from .results import MIB, failed_row, score_vram
from .rows import STEPS, VramCase, factory, input_spec, optimizer, predict, without_context

Emit = Callable[[dict], None]
CONTEXT_SLACK = 32 * MIB  # a check's first ops against the calibration probe's: other kernels, other handles


@contextlib.contextmanager
def gpu_lock():
    """Hold the kit's GPU lock (checks measure one at a time; predictions, on the CPU, run alongside)."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _nvml_self() -> Callable[[], int | None]:
    """A function reading NVML's figure for this process (None without NVML), through the monitor's reader."""
    from optuna_memprune.monitor import gpu_reader

    reader = gpu_reader()
    return (lambda: reader.used_by({os.getpid()})) if reader is not None else (lambda: None)


def _batch(case: VramCase, torch: Any, dev: Any):
    shape, dtype = input_spec(case)
    if dtype == "uint8":  # SB3 converts images inside the step: the float copy is live
        return torch.randint(0, 256, (case.batch, *shape), dtype=torch.uint8, device=dev).float() / 255
    if dtype == "int64":
        return torch.randint(0, 1000, (case.batch, *shape), dtype=torch.int64, device=dev)
    return torch.randn((case.batch, *shape), device=dev)


def train_steps(
    case: VramCase, steps: int = STEPS, on_step: Callable[[int], None] | None = None, *, device: str = "cuda"
) -> float:
    """The traced step for real (on CUDA unless ``device`` says otherwise), ``steps`` times: frozen copies
    forward under ``no_grad`` on a batch of their own, the batch, forward, the mean of the outputs as loss,
    ``zero_grad(set_to_none=True)``, backward, the optimizer's step (torch's defaults: ``foreach`` on CUDA).
    Returns the last loss."""
    import torch

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    make, frozen = factory(case)
    net = make().to(dev).train()
    targets = [make().to(dev).requires_grad_(False) for _ in range(frozen)]
    cls, kwargs = optimizer(case)
    opt = cls(net.parameters(), **kwargs)
    for step in range(steps):
        for target in targets:
            with torch.no_grad():
                target(_batch(case, torch, dev))
        loss = net(_batch(case, torch, dev)).float().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = float(loss.detach())
        del loss
        if cuda:
            torch.cuda.synchronize()
        if on_step is not None:
            on_step(step)
    return value


def _release() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def predictions(args: dict, emit: Emit) -> None:
    """One row per case of ``args["cases"]`` with its prediction by component (``parts``) or why there is
    none (``error``). Needs no GPU: it runs while the guard checks have the GPU."""
    for c in args["cases"]:
        case = VramCase(**c)
        try:
            emit(
                {
                    "check": f"predict {case.key}",
                    "kind": "prediction",
                    "ok": None,
                    "key": case.key,
                    "parts": predict(case),
                }
            )
        except Exception as e:  # noqa: BLE001 - a model the tracer cannot take is a row saying so
            emit(
                {
                    "check": f"predict {case.key}",
                    "kind": "prediction",
                    "ok": None,
                    "key": case.key,
                    "error": f"{type(e).__name__}: {e}",
                }
            )


def vram_model(args: dict, emit: Emit) -> None:
    """Measure each case of one model with ``cudnn.benchmark`` off and on against its prediction
    (``args["predictions"]``: key -> parts or the reason there is none; a case without one is predicted
    here first, before CUDA starts); one row per (case, setting). NVML's figure is read after the 4 steps:
    the allocator gives nothing back between them, so it is the context plus the peak reserved (and
    whatever earlier rows of this process loaded outside the allocator)."""
    cases = [VramCase(**c) for c in args["cases"]]
    preds: dict[str, Any] = dict(args.get("predictions") or {})
    missing = [c.to_dict() for c in cases if c.key not in preds]
    if missing:
        predictions({"cases": missing}, lambda row: preds.__setitem__(row["key"], row.get("parts", row.get("error"))))
    import torch

    with gpu_lock():
        nvml = _nvml_self()
        for bench in args.get("benchmark", (False, True)):
            torch.backends.cudnn.benchmark = bool(bench)
            for case in cases:
                row = {
                    "check": f"vram {case.key} bench={int(bench)}",
                    "kind": "vram",
                    "ok": None,
                    "benchmark": bool(bench),
                    **case.to_dict(),
                }
                parts = preds[case.key]
                if isinstance(parts, str):
                    emit(failed_row(row["check"], f"not predicted: {parts}", **_fields(row)))
                    continue
                overhead = sum(v for k, v in parts.items() if k.endswith("allocator overhead"))
                row.update(
                    pred_reserved=without_context(parts),
                    pred_total=sum(parts.values()),
                    pred_allocated=without_context(parts) - overhead,
                    parts=parts,
                )
                try:
                    _release()
                    torch.cuda.reset_peak_memory_stats()
                    row["reserved_at_start"] = torch.cuda.memory_reserved()
                    train_steps(case)
                    row.update(
                        max_reserved=torch.cuda.max_memory_reserved(),
                        max_allocated=torch.cuda.max_memory_allocated(),
                        nvml=nvml(),
                    )
                    emit(score_vram(row))
                except Exception as e:  # noqa: BLE001 - CUDA OOM or a model's failure: this row only
                    emit(failed_row(row["check"], f"{type(e).__name__}: {e}", **_fields(row)))
                finally:
                    _release()


def _fields(row: dict) -> dict:
    return {k: row[k] for k in ("kind", "family", "model", "batch", "optimizer", "benchmark") if k in row}


def conv_workspaces(args: dict, emit: Emit) -> None:
    """cuDNN's workspace per conv shape: the peak allocated during one conv's forward and its backward above
    the tensors that must exist (input, weight, output; their gradients), with ``cudnn.benchmark`` off and on.
    torch does not expose which algorithm cuDNN chose; the workspace is what the memory model misses."""
    import torch
    from torch import nn

    from .rows import CNN_INPUT, VramCase

    with gpu_lock():
        dev = torch.device("cuda")
        shapes: dict[tuple, None] = {}
        for model in args["models"]:
            case = VramCase("CNN", model, 1, "SGD")
            make, _ = factory(case)
            net = make().net.to(dev)
            hooks = [
                m.register_forward_hook(
                    lambda m, i, o: shapes.setdefault(
                        (
                            tuple(i[0].shape[1:]),
                            m.out_channels,
                            m.kernel_size,
                            m.stride,
                            m.padding,
                            m.dilation,
                            m.groups,
                        ),
                        None,
                    )
                )
                for m in net.modules()
                if isinstance(m, nn.Conv2d)
            ]
            with torch.no_grad():
                net(torch.randn((1, *CNN_INPUT), device=dev))
            for h in hooks:
                h.remove()
            del net
        batch = int(args.get("batch", 32))
        for shape in list(shapes)[: int(args.get("max_shapes", 40))]:
            (c, h, w), out_c, k, s, p, d, g = shape
            label = f"conv in={c}x{h}x{w} out={out_c} k={k[0]} s={s[0]} g={g} b{batch}"
            row: dict[str, Any] = {"check": f"cudnn {label}", "kind": "cudnn", "ok": None}
            try:
                for bench in (False, True):
                    torch.backends.cudnn.benchmark = bench
                    _release()
                    conv = nn.Conv2d(c, out_c, k, s, p, d, g).to(dev)
                    x = torch.randn((batch, c, h, w), device=dev, requires_grad=True)
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    y = conv(x)
                    fwd = torch.cuda.max_memory_allocated() - base - _nbytes(y)
                    grad = torch.ones_like(y)
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    y.backward(grad)
                    made = _nbytes(x.grad) + sum(_nbytes(q.grad) for q in conv.parameters())
                    bwd = torch.cuda.max_memory_allocated() - base - made
                    row[f"fwd_ws_bench{int(bench)}"], row[f"bwd_ws_bench{int(bench)}"] = max(0, fwd), max(0, bwd)
                    del conv, x, y, grad
                row["detail"] = (
                    label
                    + " workspace MiB fwd/bwd: benchmark off "
                    + (
                        f"{row['fwd_ws_bench0'] / MIB:.1f}/{row['bwd_ws_bench0'] / MIB:.1f}, on "
                        f"{row['fwd_ws_bench1'] / MIB:.1f}/{row['bwd_ws_bench1'] / MIB:.1f} (algorithm: not exposed by torch)"
                    )
                )
                emit(row)
            except Exception as e:  # noqa: BLE001
                emit(failed_row(row["check"], f"{type(e).__name__}: {e}", kind="cudnn"))
            finally:
                _release()


def _nbytes(t: Any) -> int:
    return 0 if t is None else t.untyped_storage().nbytes()


def context(args: dict, emit: Emit) -> None:
    """NVML's figure for this process minus torch's reserved memory (what lies outside the caching allocator:
    the CUDA context, lazily loaded kernel modules, library handles) after each first op, against the
    context the calibration measured on this host under the same loading (``CONTEXT_SLACK`` allowed: the
    probe's ops differ). ``args["loading"]`` sets ``CUDA_MODULE_LOADING`` first."""
    loading = args.get("loading")
    if loading:
        os.environ["CUDA_MODULE_LOADING"] = loading
    import torch
    from torch import nn

    from optuna_memprune.estimate.calibration import load

    with gpu_lock():
        nvml = _nvml_self()
        dev = torch.device("cuda")
        stages: list[tuple[str, int | None, int]] = []

        def mark(name: str) -> None:
            torch.cuda.synchronize()
            stages.append((name, nvml(), torch.cuda.memory_reserved()))

        x = torch.zeros(1, device=dev)
        mark("init")
        a = torch.randn(512, 512, device=dev)
        (a @ a).sum().item()
        mark("first matmul (cuBLAS)")
        conv = nn.Conv2d(3, 16, 3).to(dev)
        img = torch.randn(8, 3, 64, 64, device=dev, requires_grad=True)
        conv(img).sum().backward()
        mark("first conv fwd+bwd (cuDNN)")
        q = torch.randn(2, 4, 128, 64, device=dev, requires_grad=True)
        nn.functional.scaled_dot_product_attention(q, q, q).sum().backward()
        mark("first attention fwd+bwd")
        lin = nn.Linear(256, 256).to(dev)
        lin(torch.randn(4, 256, device=dev)).sum().backward()
        torch.optim.Adam(lin.parameters()).step()
        mark("first Adam step")
        del x, a, conv, img, q, lin
        costs = load().cuda_costs()  # the calibrated figure under this loading (its probe: seconds)
        calibrated = costs.context
        tag = loading or os.environ.get("CUDA_MODULE_LOADING", "default(lazy)")
        for name, used, reserved in stages:
            outside = None if used is None else used - reserved
            emit(
                {
                    "check": f"context {tag} {name}",
                    "kind": "context",
                    "ok": None,
                    "stage": name,
                    "loading": tag,
                    "nvml": used,
                    "reserved": reserved,
                    "outside_allocator": outside,
                    "detail": (
                        f"NVML {used / MIB:.0f} MiB, reserved {reserved / MIB:.0f} MiB, outside the "
                        f"allocator {outside / MIB:.0f} MiB (calibrated context {calibrated / MIB:.0f} MiB)"
                        if used is not None
                        else "NVML gives no figure for this process"
                    ),
                }
            )
        final = stages[-1][1]
        ok = final is not None and costs.measured and stages[-1][1] - stages[-1][2] <= calibrated + CONTEXT_SLACK
        emit(
            {
                "check": f"context {tag} within the calibrated figure",
                "kind": "context",
                "ok": ok,
                "calibrated": calibrated,
                "measured": costs.measured,
                "cublas_workspace": costs.cublas_workspace,
                "detail": (
                    f"after the first ops {((final or 0) - stages[-1][2]) / MIB:.0f} MiB outside the "
                    f"allocator vs {calibrated / MIB:.0f} MiB calibrated on {costs.gpu or 'nothing'}"
                    + ("" if costs.measured else f" (not measured: {costs.error}; the default)")
                    + f"; cuBLAS workspace {costs.cublas_workspace / MIB:.1f} MiB"
                ),
            }
        )


def allocator_steps(args: dict, emit: Emit) -> None:
    """The caching allocator across 4 steps: reserved and peak figures after each. The model replays 2 steps
    and assumes the pattern is steady from the second: passes when the peak reserved stops growing there."""
    import torch

    case = VramCase(**args["case"])
    with gpu_lock():
        _release()
        torch.cuda.reset_peak_memory_stats()
        seen: list[dict[str, int]] = []
        train_steps(
            case,
            steps=4,
            on_step=lambda s: seen.append(
                {
                    "step": s + 1,
                    "reserved": torch.cuda.memory_reserved(),
                    "max_reserved": torch.cuda.max_memory_reserved(),
                    "max_allocated": torch.cuda.max_memory_allocated(),
                    "segments": torch.cuda.memory_stats().get("segment.all.current", 0),
                }
            ),
        )
        steady = seen[1]["max_reserved"] == seen[-1]["max_reserved"]
        emit(
            {
                "check": f"allocator 4 steps {case.key}",
                "kind": "allocator",
                "ok": steady,
                "steps": seen,
                "detail": "max reserved MiB per step "
                + ", ".join(f"{s['max_reserved'] / MIB:.1f}" for s in seen)
                + ("; steady from step 2" if steady else "; still growing after step 2 (the model replays 2)"),
            }
        )
        _release()
