"""Probe: the RSS and threads of a process that imported a stack, set torch's threads and ran a first step.

Imports only that stack besides procfs (one process per torch thread count); knows nothing of the cache.
"""

from __future__ import annotations

import importlib
from typing import Any

from ...procfs import KiB, field, own_status, read
from . import emit, spec


def main() -> None:
    """Import the stack, then (with torch) run a matmul and, if asked, a tiny training step, and measure.

    The first optimizer step imports about 800 modules of torch's compiler stack: tens of MB, once.
    """
    args = spec()
    for mod in args["imports"]:
        importlib.import_module(mod)
    result: dict[str, Any] = {"imports": own_status()}
    if "torch" in args["imports"]:
        import torch

        result["default_torch_threads"] = torch.get_num_threads()
        net = torch.nn.Sequential(
            torch.nn.Conv2d(4, 8, 3),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * 14 * 14, 32),
            torch.nn.Linear(32, 4),
        )
        opt = torch.optim.Adam(net.parameters()) if args["train"] else None

        def step() -> None:
            if opt is None:
                with torch.no_grad():
                    net(torch.zeros(8, 4, 16, 16))
                return
            for _ in range(3):
                net(torch.zeros(8, 4, 16, 16)).square().mean().backward()
                opt.step()
                opt.zero_grad()

        torch.set_num_threads(args["threads"])
        a = torch.ones(512, 512)
        for _ in range(4):
            (a @ a).sum()
        step()
    warm = own_status()
    # The file-backed pages in its RSS (shared libraries touched): what the kernel takes back first when the
    # host is short of memory; a recheck tells a host under pressure from a drifted stack by them.
    warm["RssFile"] = field(read("/proc/self/status"), b"\nRssFile:") * KiB
    result["warm"] = warm
    emit(result)


if __name__ == "__main__":
    main()
