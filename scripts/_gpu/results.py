"""Scoring and writing the GPU check: each row's error, the two summary lines, the JSON file.

Owns the error arithmetic (signed error of a prediction against a measurement), what a passed check is,
and where the result goes; knows nothing of CUDA, torch or the guard. All sizes are bytes.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any, Iterable, Mapping

MIB = 1 << 20
DEFAULT_NAME = "gpu_check.json"


def signed_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: negative is an under-prediction."""
    if not measured or measured <= 0:
        raise ValueError(f"measured must be a positive number of bytes, but got {measured!r}.")
    if predicted is None or predicted < 0:
        raise ValueError(f"predicted must be a non-negative number of bytes, but got {predicted!r}.")
    return (predicted - measured) / measured


def score_vram(row: Mapping[str, Any]) -> dict[str, Any]:
    """A measured VRAM row with its errors: ``err`` (prediction without the CUDA context against
    ``max_memory_reserved``, the headline), ``err_allocated`` (the tensor timeline's peak allocated against
    ``max_memory_allocated``) and ``err_nvml`` (the whole prediction against NVML's per-process figure)."""
    out = dict(row)
    pairs = (
        ("err", "pred_reserved", "max_reserved"),
        ("err_allocated", "pred_allocated", "max_allocated"),
        ("err_nvml", "pred_total", "nvml"),
    )
    for name, pred, meas in pairs:
        if out.get(pred) is not None and out.get(meas):
            out[name] = signed_error(out[pred], out[meas])
    return out


def vram_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Figures over the scored rows (those with ``err``); failed rows are counted, never scored."""
    rows = list(rows)
    errs = [r["err"] for r in rows if r.get("err") is not None]
    s: dict[str, Any] = {"rows": len(errs), "failed": sum(1 for r in rows if r.get("ok") is False)}
    if errs:
        s.update(
            median_err=statistics.median(abs(e) for e in errs),
            max_err=max(abs(e) for e in errs),
            under=sum(e < 0 for e in errs),
        )
    for extra in ("err_allocated", "err_nvml"):
        vals = [abs(r[extra]) for r in rows if r.get(extra) is not None]
        if vals:
            s[f"median_{extra}"] = statistics.median(vals)
    return s


def _pct(x: float | None) -> str:
    return "nan" if x is None else f"{100 * x:.1f}"


def vram_line(s: Mapping[str, Any]) -> str:
    return (
        f"GPU_VRAM rows={s['rows']} median_err={_pct(s.get('median_err'))}% under={s.get('under', 0)} "
        f"max_err={_pct(s.get('max_err'))}%"
    )


def guard_summary(checks: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    checks = list(checks)
    return {"checks": len(checks), "passed": sum(c.get("ok") is True for c in checks)}


def guard_line(s: Mapping[str, int]) -> str:
    return f"GPU_GUARD checks={s['checks']} passed={s['passed']}"


def failed_row(check: str, why: str, **extra: Any) -> dict[str, Any]:
    """The row of a check that did not finish (its exception, its time limit, its process's death)."""
    return {"check": check, "ok": False, "detail": " ".join(str(why).split())[:300], **extra}


def format_row(row: Mapping[str, Any]) -> str:
    """One printed line per row: VRAM rows with their figures in MiB, the others with their verdict."""
    status = {True: "ok", False: "FAIL", None: "info"}[row.get("ok")]
    if row.get("kind") == "vram" and row.get("max_reserved"):
        mib = lambda k: f"{row[k] / MIB:8.1f}" if row.get(k) is not None else "     n/a"  # noqa: E731
        err = lambda k: f"{100 * row[k]:+6.1f}%" if row.get(k) is not None else "    n/a"  # noqa: E731
        return (
            f"{status:<4} vram {row['model'][:22]:<22} b{row['batch']:<5}{row['optimizer']:<5} "
            f"bench={int(row['benchmark'])} pred {mib('pred_reserved')} reserved {mib('max_reserved')} "
            f"{err('err')} | alloc {mib('max_allocated')} {err('err_allocated')} | nvml {mib('nvml')} "
            f"{err('err_nvml')} MiB"
        )
    return f"{status:<4} {row.get('check', '?')}: {row.get('detail', '')}"


def default_out(environ: Mapping[str, str] | None = None) -> Path:
    """``$OUT/gpu_check.json`` where ``OUT`` is set (the GPU host hands that folder back), else the working
    directory's ``gpu_check.json``."""
    env = os.environ if environ is None else environ
    base = env.get("OUT")
    return Path(base) / DEFAULT_NAME if base else Path(DEFAULT_NAME)


def build(meta: Mapping[str, Any], vram_rows: list[dict], other_rows: list[dict], guard_rows: list[dict]) -> dict:
    """The whole result: the host, every row, both summaries and their printed lines."""
    vs, gs = vram_summary(vram_rows), guard_summary(guard_rows)
    return {
        "meta": dict(meta),
        "vram": vram_rows,
        "cuda": other_rows,
        "guard": guard_rows,
        "summary": {"vram": vs, "vram_by": breakdown(vram_rows), "guard": gs, "lines": [vram_line(vs), guard_line(gs)]},
    }


def breakdown(vram_rows: list[dict]) -> dict[str, dict[str, Any]]:
    """``vram_summary`` per family (CNN, transformer, rl) and per ``cudnn.benchmark`` setting."""
    groups: dict[str, list[dict]] = {}
    for row in vram_rows:
        if row.get("family"):
            groups.setdefault(f"family={row['family']}", []).append(row)
        if row.get("benchmark") is not None:
            groups.setdefault(f"benchmark={int(row['benchmark'])}", []).append(row)
    return {name: vram_summary(rs) for name, rs in sorted(groups.items())}


def write_json(result: Mapping[str, Any], path: Path | str) -> Path:
    """Write ``result`` as indented JSON (non-finite floats as null), creating the folder; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(result), indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(path)
    return path


def _finite(x: Any) -> Any:
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
