"""gpu_reader against a fake NVML module (no GPU here), the real pynvml without a GPU, and a real GPU when
one exists (marked gpu)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from optuna_memprune.monitor import GpuReader, Monitor, gpu_reader, read_tree
from optuna_memprune.monitor._nvml import auto_gpu_reader

from _monitor_worker import Worker

MiB, GiB = 1024**2, 1024**3
HAS_NVIDIA_DEVICE = os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """The part of pynvml that gpu_reader uses. ``devices``: per GPU, total bytes and the compute and
    graphics process lists as (pid, usedGpuMemory) pairs; ``broken``: GPUs whose lists raise."""

    NVMLError = FakeNVMLError

    def __init__(self, devices: list[dict], *, fail_init: bool = False, broken: tuple[int, ...] = ()) -> None:
        self.devices = devices
        self.fail_init = fail_init
        self.broken = broken
        self.inits = self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise FakeNVMLError("Driver Not Loaded")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        if not 0 <= index < len(self.devices):
            raise FakeNVMLError("Invalid Argument")
        return ("gpu", index)

    def _list(self, handle: tuple[str, int], kind: str) -> list[SimpleNamespace]:
        if handle[1] in self.broken:
            raise FakeNVMLError("Not Supported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.devices[handle[1]].get(kind, [])]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: tuple[str, int]) -> list[SimpleNamespace]:
        return self._list(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: tuple[str, int]) -> list[SimpleNamespace]:
        return self._list(handle, "graphics")

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[str, int]) -> SimpleNamespace:
        dev = self.devices[handle[1]]
        used = sum(u or 0 for kind in ("compute", "graphics") for _, u in dev.get(kind, []))
        return SimpleNamespace(total=dev["total"], used=used, free=dev["total"] - used)


TWO_GPUS = [
    {
        "total": 80 * GiB,
        "compute": [(100, 1 * GiB), (999, 5 * GiB)],
        "graphics": [(100, 1 * GiB)],
    },  # pid 100 is C+G: one figure, listed twice
    {"total": 40 * GiB, "compute": [(101, 512 * MiB), (100, 256 * MiB), (102, None)]},  # None: the driver cannot tell
]


def test_used_by_sums_only_the_given_pids_over_all_devices() -> None:
    reader = gpu_reader(FakeNVML(TWO_GPUS))
    assert isinstance(reader, GpuReader) and reader.count == 2
    assert reader.used_by({100, 101}) == 1 * GiB + 512 * MiB + 256 * MiB
    assert reader.used_by({100}) == 1 * GiB + 256 * MiB
    assert reader.used_by([999]) == 5 * GiB
    assert reader.used_by({102}) == 0  # usedGpuMemory None counts as 0
    assert reader.used_by({4242}) == 0 and reader.used_by(set()) == 0


def test_devices_lists_index_total_used() -> None:
    reader = gpu_reader(FakeNVML(TWO_GPUS))
    assert reader.devices() == [(0, 80 * GiB, 7 * GiB), (1, 40 * GiB, 768 * MiB)]


def test_a_device_whose_lists_fail_is_skipped() -> None:
    reader = gpu_reader(FakeNVML(TWO_GPUS, broken=(0,)))
    assert reader.used_by({100, 101}) == 512 * MiB + 256 * MiB


def test_init_failure_or_no_device_gives_none() -> None:
    assert gpu_reader(FakeNVML(TWO_GPUS, fail_init=True)) is None
    empty = FakeNVML([])
    assert gpu_reader(empty) is None and empty.shutdowns == 1  # the init it took is given back


def test_close_shuts_nvml_down_once() -> None:
    nvml = FakeNVML(TWO_GPUS)
    reader = gpu_reader(nvml)
    reader.close()
    reader.close()
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
    assert reader.used_by({100}) == 0


def test_read_tree_and_monitor_ask_for_the_trees_pids() -> None:
    w = Worker()
    try:
        child = int(w.cmd("spawn"))
        nvml = FakeNVML([{"total": 80 * GiB, "compute": [(w.pid, 300 * MiB), (child, 200 * MiB), (1, 7 * GiB)]}])
        reader = gpu_reader(nvml)
        assert read_tree(w.pid, gpu=reader).vram == 500 * MiB
        assert read_tree(child, gpu=reader).vram == 200 * MiB
        with Monitor(w.pid, interval=0.02, gpu=reader) as mon:
            nvml.devices[0]["compute"][1] = (child, 1 * GiB)  # the child's allocator grows
            time.sleep(0.1)
        assert mon.peak.vram == 300 * MiB + 1 * GiB
        assert {p[3] for p in mon.timeline()} == {500 * MiB, 300 * MiB + 1 * GiB}
    finally:
        w.close()


@pytest.mark.skipif(HAS_NVIDIA_DEVICE, reason="this machine has an NVIDIA device")
def test_real_pynvml_without_a_gpu_gives_none() -> None:
    pytest.importorskip("pynvml")
    assert gpu_reader() is None
    assert auto_gpu_reader() is None
    assert read_tree(gpu="auto").vram is None
    with Monitor(gpu="auto", interval=0.05) as mon:
        pass
    assert mon.latest.vram is None and mon.peak.vram is None


@pytest.mark.gpu
def test_real_gpu_readings() -> None:
    reader = gpu_reader()
    if reader is None:
        pytest.skip("no NVIDIA GPU/NVML on this machine")
    devices = reader.devices()
    assert devices and all(total > 0 and 0 <= used <= total for _, total, used in devices)
    assert reader.used_by({os.getpid()}) >= 0
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here; NVML answered, per-process memory unchecked")
    block = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    used = reader.used_by({os.getpid()})
    # CUDA context + at least the block; 0 means NVML reports pids of another namespace (containers)
    assert used >= 256 * MiB, used
    assert read_tree(gpu=reader).vram == used
    del block
