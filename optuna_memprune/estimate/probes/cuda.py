"""Probe: what a CUDA process holds besides its tensors on this host's first visible GPU.

After a first matmul, linear layer, convolution, attention and Adam step (each loads its kernels and
handles, lazily by default): ``context``, NVML's figure for this process less what torch's caching allocator
reserved (the driver's context, loaded modules, cuDNN and cuBLAS handles); ``cublas_workspace``, the bytes
still allocated through the allocator once the ops' own tensors are gone (cuBLAS and cuBLASLt workspaces,
kept for the process's life). Knows nothing of the cache.
"""

from __future__ import annotations

import os
from typing import Any

from . import emit


def _nvml_used(pid: int) -> tuple[int, str, str]:
    """(bytes NVML counts for ``pid`` on the first visible GPU, its name, the driver version)."""
    import pynvml

    pynvml.nvmlInit()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    index = int(visible) if visible.isdigit() else 0
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    used = 0
    for get in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
        for proc in get(handle):
            if proc.pid == pid and proc.usedGpuMemory:
                used = max(used, int(proc.usedGpuMemory))
    name = pynvml.nvmlDeviceGetName(handle)
    driver = pynvml.nvmlSystemGetDriverVersion()
    return (
        used,
        name.decode() if isinstance(name, bytes) else name,
        driver.decode() if isinstance(driver, bytes) else driver,
    )


def measure() -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        return {"error": "no CUDA device visible"}
    dev = torch.device("cuda")
    torch.ones(1, device=dev)
    before = torch.cuda.memory_allocated()
    a = torch.randn(64, 64, device=dev)
    out = a @ a
    lin = torch.nn.Linear(64, 64).to(dev)
    lin(a).sum().backward()
    del out
    held = sum(p.numel() * p.element_size() for p in lin.parameters()) * 2 + a.numel() * a.element_size()
    cublas = max(0, torch.cuda.memory_allocated() - before - held)
    conv = torch.nn.Conv2d(4, 8, 3).to(dev)
    x = torch.randn(2, 4, 16, 16, device=dev, requires_grad=True)
    conv(x).sum().backward()
    q = torch.randn(2, 2, 16, 8, device=dev, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
    opt = torch.optim.Adam(list(lin.parameters()) + list(conv.parameters()))
    opt.step()
    torch.cuda.synchronize()
    nvml, name, driver = _nvml_used(os.getpid())
    if not nvml:
        return {"error": "NVML lists no memory for this process (another pid namespace?)", "gpu": name}
    return {
        "context": max(0, nvml - torch.cuda.memory_reserved()),
        "cublas_workspace": cublas,
        "gpu": name,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


if __name__ == "__main__":
    try:
        result = measure()
    except Exception as e:  # noqa: BLE001 - reported as the probe's result: the estimates keep the defaults
        result = {"error": f"{type(e).__name__}: {e}"}
    emit(result)
