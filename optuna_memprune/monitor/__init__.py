"""Live readings of a process tree: RSS, peak RSS (VmHWM), PSS, threads, and GPU memory per process via NVML.

Knows nothing of Optuna, estimates or budgets; imports pynvml only when a GPU reading is first asked for.
"""

from __future__ import annotations

from ._monitor import Monitor, downsample
from ._nvml import GpuReader, auto_gpu_reader, gpu_reader
from ._proc import read_tree
from ._trend import Forecast, forecast, steps_of
from ._types import MonitorError, ProcessGone, Reading

__all__ = [
    "Reading",
    "read_tree",
    "Monitor",
    "gpu_reader",
    "auto_gpu_reader",
    "GpuReader",
    "MonitorError",
    "ProcessGone",
    "downsample",
    "Forecast",
    "forecast",
    "steps_of",
]
