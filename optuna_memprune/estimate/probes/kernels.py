"""Probe: the buffers oneDNN convolutions allocate inside the op, on reference convolutions, fitted per rule.

Features come from ``torchnet.workspaces`` (so probe and estimator cannot drift); knows nothing of the cache.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable
from typing import Any

from ...procfs import own_status, reset_peak
from . import emit, spec

#: glibc's mallopt parameter M_MMAP_THRESHOLD (malloc.h); setting it also stops its dynamic raise.
_M_MMAP_THRESHOLD = -3


def peak_of(call: Callable[[], Any]) -> tuple[Any, int]:
    """``call()``'s result and its peak RSS above the RSS before it: the median of three runs (a few small
    allocations of the interpreter come and go)."""
    peaks = []
    out = None
    for _ in range(3):
        out = None
        reset_peak()
        before = own_status()["VmRSS"]
        out = call()
        peaks.append(own_status()["VmHWM"] - before)
    return out, sorted(peaks)[1]


def mapped(t: Any) -> int:
    """The bytes of the pages a tensor's storage maps (glibc maps large buffers page by page)."""
    nbytes: int = t.untyped_storage().nbytes()
    return -(-nbytes // 4096) * 4096


def measure(torch: Any, convs: list[list[Any]]) -> tuple[list[dict[str, Any]], int]:
    """Per op (forward, backward) of each reference convolution: its peak above inputs and outputs, and its
    workspace features."""
    from ..torchnet.workspaces import channel_block, workspace_features

    aten = torch.ops.aten
    block = channel_block()
    rows = []
    for ci, co, k, stride, size, batch, grad_in in convs:
        x, w, b = torch.rand(batch, ci, size, size), torch.rand(co, ci, k, k), torch.rand(co)
        geo = ([stride, stride], [k // 2, k // 2], [1, 1], False, [0, 0], 1)
        fwd_args = (x, w, b, *geo)

        def fwd(fwd_args: tuple[Any, ...] = fwd_args) -> Any:
            return aten.convolution.default(*fwd_args)

        gy = torch.rand_like(fwd())
        bwd_args = (gy, x, w, [co], *geo, [grad_in, True, True])

        def bwd(bwd_args: tuple[Any, ...] = bwd_args) -> Any:
            return aten.convolution_backward.default(*bwd_args)

        for _ in range(2):  # primitive creation and its caches are one-off
            fwd()
            bwd()
        y, peak = peak_of(fwd)
        rows.append(
            {
                "op": "fwd",
                "measured": max(0, peak - mapped(y)),
                "features": workspace_features(aten.convolution.default, fwd_args, {}, y, block),
            }
        )
        grads, peak = peak_of(bwd)
        rows.append(
            {
                "op": "bwd",
                "measured": max(0, peak - sum(mapped(g) for g in grads if g is not None)),
                "features": workspace_features(aten.convolution_backward.default, bwd_args, {}, grads, block),
            }
        )
    return rows, block


def fit(torch: Any, n_rules: int, rows: list[dict[str, Any]]) -> list[float]:
    """Per op kind, bytes = sum(coefficient x feature): least squares on the relative error, coefficients >= 0
    (every subset of the op's rules is solved; the best non-negative solution wins)."""
    coef = [0.0] * n_rules
    for op in ("fwd", "bwd"):
        mine = [r for r in rows if r["op"] == op and r["measured"] > 0]
        rules = sorted({k for r in mine for k, _ in r["features"]})
        best = None
        for n in range(1, len(rules) + 1):
            for subset in itertools.combinations(rules, n):
                a = torch.tensor(
                    [[dict(r["features"]).get(k, 0) / r["measured"] for k in subset] for r in mine], dtype=torch.float64
                )
                sol = torch.linalg.lstsq(a, torch.ones(len(mine), 1, dtype=torch.float64)).solution.flatten()
                if bool((sol >= 0).all()):
                    err = float(((a @ sol) - 1).square().sum())
                    if best is None or err < best[0]:
                        best = (err, subset, sol.tolist())
        if best is not None:
            for k, c in zip(best[1], best[2], strict=False):
                coef[k] = round(c, 4)
    return coef


def main() -> None:
    """Pin glibc's mmap threshold low (every large buffer a fresh mapping, returned at free: the figure is the
    op's own peak, not what the heap had cached), measure, fit; an error result where it cannot."""
    args = spec()
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, 64 * 1024)
        reset_peak()
        import torch

        from ..torchnet.workspaces import WORKSPACE_RULES

        torch.set_num_threads(1)
        rows, block = measure(torch, args["convs"])
        result = {
            "rows": rows,
            "block": block,
            "rules": list(WORKSPACE_RULES),
            "coef": fit(torch, len(WORKSPACE_RULES), rows),
        }
    except (OSError, AttributeError, RuntimeError) as e:  # no glibc, no clear_refs, no oneDNN
        result = {"error": f"{type(e).__name__}: {e}"}
    emit(result)


if __name__ == "__main__":
    main()
