"""The entry of one check's own process: ``python -m _gpu.worker CHECK ARGS_JSON ROWS_FILE``.

Owns the table of checks by name and appending each row to ``ROWS_FILE`` as soon as it exists (one JSON
object a line), so a timeout keeps what finished; knows nothing of time limits or summaries.
"""

from __future__ import annotations

import json
import sys
from typing import Callable

from . import cuda_checks, guard_checks
from .results import failed_row

CHECKS: dict[str, Callable[[dict, Callable[[dict], None]], None]] = {
    "predict": cuda_checks.predictions,
    "vram": cuda_checks.vram_model,
    "cudnn": cuda_checks.conv_workspaces,
    "context": cuda_checks.context,
    "allocator": cuda_checks.allocator_steps,
    "breach_in_process": guard_checks.breach_in_process,
    "breach_per_process": guard_checks.breach_per_process,
    "cuda_oom": guard_checks.cuda_oom,
    "nvml_vs_torch": guard_checks.nvml_vs_torch,
    "learned_vram": guard_checks.learned_vram,
    "small_card": guard_checks.small_card,
}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in CHECKS:
        print(f"usage: python -m _gpu.worker {{{','.join(CHECKS)}}} ARGS_JSON ROWS_FILE", file=sys.stderr)
        return 2
    name, args, path = argv[0], json.loads(argv[1]), argv[2]

    def emit(row: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(json.dumps(row, default=str)[:300], flush=True)

    try:
        CHECKS[name](args, emit)
    except Exception as e:  # noqa: BLE001 - the check's failure is its row; the exit code says so too
        emit(failed_row(args.get("label", name), f"{type(e).__name__}: {e}"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
