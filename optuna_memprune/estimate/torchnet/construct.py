"""Calling a model factory without allocating the model: on meta, or for constructors that read tensor data.

Owns ``call_factory``; knows nothing of specs, tracing, caching or footprints.

A factory is first called under ``torch.device("meta")``: every tensor it makes is an empty meta tensor. Some
constructors compute their architecture with tensors and read the values back (torchvision's RegNet calls
``.tolist()`` on its block widths; others call ``.item()``), which meta tensors cannot give. Such a factory is
called again with CPU as the default device while every parameter and buffer is moved to meta as the module
registers it (what ``accelerate.init_empty_weights`` does): the small tensors the constructor computes with are
real, the weights are not. A parameter is registered before its module initialises it, so its CPU storage is
never written (``torch.empty`` maps untouched pages); a buffer made with ``torch.zeros`` is written, and is
small. Before that second call, a bound is checked: the CPU tensors the constructor may keep alive at once are
counted as it runs, and past ``CPU_LIMIT_BYTES`` the build stops with an error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ...exceptions import EstimateError

__all__ = ["CPU_LIMIT_BYTES", "call_factory"]

# Most bytes of live CPU tensors a data-reading constructor may hold at once (parameters and buffers are on
# meta as soon as they are registered, so this bounds what it computes with, not the model).
CPU_LIMIT_BYTES = 256 * 2**20
_PATCH_LOCK = threading.Lock()
_HERE = threading.local()  # .active: this thread is inside the patched build


class _CountCPU(TorchFunctionMode):
    """Counts the bytes of the CPU tensors made under it that are still alive; raises past the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.live = limit, 0
        self._seen: dict[int, int] = {}

    def _gone(self, key: int) -> None:
        self.live -= self._seen.pop(key, 0)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.device.type == "cpu" and not isinstance(out, nn.Parameter):
            try:
                st = out.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                return out
            key = id(st)
            if key not in self._seen:
                import weakref

                self._seen[key] = st.nbytes()
                self.live += st.nbytes()
                weakref.finalize(st, self._gone, key)
                if self.live > self.limit:
                    raise EstimateError(
                        f"the model's constructor holds more than {self.limit} bytes of CPU tensors at once "
                        "while building on CPU (its parameters and buffers go to meta as they are registered)"
                    )
        return out


def _to_meta(t: Any) -> Any:
    if t is None or t.device.type == "meta":
        return t
    new = torch.empty_like(t, device="meta")
    return nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new


def _build_on_cpu_with_meta_weights(factory: Callable[[], Any]) -> Any:
    """``factory()`` with CPU as the default device and every parameter and buffer moved to meta as it is
    registered. The patch of ``nn.Module``'s two methods is process-wide for the call's duration, but acts
    only in this thread: other threads building their own modules meanwhile get the originals' behaviour."""
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def param(self: nn.Module, name: str, p: nn.Parameter | None) -> None:
        register_parameter(self, name, _to_meta(p) if getattr(_HERE, "active", False) else p)

    def buffer(self: nn.Module, name: str, t: torch.Tensor | None, persistent: bool = True) -> None:
        register_buffer(self, name, _to_meta(t) if getattr(_HERE, "active", False) else t, persistent)

    with _PATCH_LOCK:
        # The class patched for the call's duration: a dynamic construct mypy cannot type (it reads the
        # functions as methods of a second self).
        nn.Module.register_parameter, nn.Module.register_buffer = param, buffer  # type: ignore[method-assign, assignment]
        _HERE.active = True
        try:
            with torch.device("cpu"), _CountCPU(CPU_LIMIT_BYTES):
                return factory()
        finally:
            _HERE.active = False
            # The patch undone (assigning to a method, as above).
            nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]
            nn.Module.register_buffer = register_buffer  # type: ignore[method-assign]


def call_factory(factory: Callable[[], Any], label: str) -> Any:
    """What ``factory()`` returns, built on meta (see the module's docstring); ``label`` names it in errors.

    Raises ``EstimateError`` saying why and what to pass instead when neither way builds it.
    """
    try:
        with torch.device("meta"):
            return factory()
    except EstimateError:
        raise
    except Exception as first:  # noqa: BLE001 - any factory that cannot build on meta: try CPU, then say both
        try:
            return _build_on_cpu_with_meta_weights(factory)
        except Exception as second:
            why = f"{type(first).__name__}: {first}"
            again = f"{type(second).__name__}: {second}"
            raise EstimateError(
                f"{label} could not be built without memory: on the meta device it failed ({why}), and on CPU "
                f"with its parameters moved to meta as registered it failed too ({again}). Pass an nn.Module "
                "instance built as usual instead (its architecture is copied to meta, its memory is never "
                "touched), or a factory that builds on the meta device."
            ) from second
