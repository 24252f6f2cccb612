"""The public functions' arguments checked and turned into a hashable ``Spec`` (the trace cache's key).

Owns the accepted dtypes and devices and their error messages; the optimizer and scheduler are resolved by
``optimizers`` (named, not built); knows nothing of tracing, caching or footprints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...exceptions import EstimateError
from ..checks import check_count, check_int

__all__ = ["Spec", "make_spec"]

_FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
_INPUT_DTYPES = _FLOAT_DTYPES + ("uint8", "int8", "int16", "int32", "int64", "bool")
_AUTOCAST_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class Spec:
    """Everything but the architecture and the batch size that decides a trace; hashable."""

    training: bool
    nets: tuple[str, ...]
    input_shapes: tuple[tuple[tuple[int, ...], ...], ...]  # per net, per input
    input_dtype: str
    dtype: str
    optimizer: str | None  # lower-case class name, for messages
    optimizer_kwargs: tuple[tuple[str, Any], ...]
    autocast: str | None
    accumulation_steps: int
    frozen: tuple[int, ...]  # per net
    cuda: bool  # target device kind
    optimizer_class: Any = None  # torch.optim class name, or the class itself when outside torch.optim
    scheduler: Any = None  # torch.optim.lr_scheduler class name or class; None for none
    scheduler_kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def foreach(self) -> bool | None:
        """The optimizer's ``foreach``: as given (None: torch's choice), else torch's default on the target
        device."""
        given: bool | None = dict(self.optimizer_kwargs).get("foreach", self.cuda)
        return given


def _check_shape(shape: Any, what: str) -> tuple[int, ...]:
    message = f"{what} must be a tuple of positive ints (batch dim excluded), but got {shape!r}."
    if not isinstance(shape, (tuple, list)):
        raise EstimateError(message)
    return tuple(check_int(d, what, minimum=1, message=message) for d in shape)


def _check_shapes(value: Any, what: str) -> tuple[tuple[int, ...], ...]:
    if isinstance(value, (tuple, list)) and value and all(isinstance(s, (tuple, list)) for s in value):
        return tuple(_check_shape(s, what) for s in value)
    return (_check_shape(value, what),)


def _check_dtype(value: Any, allowed: Sequence[str], what: str) -> str:
    text = str(value).replace("torch.", "") if value is not None else None
    if text not in allowed:
        raise EstimateError(f"{what} must be one of {', '.join(map(repr, allowed))}, but got {value!r}.")
    return text  # type: ignore[return-value]


def _check_frozen(frozen: Any, nets: tuple[str, ...]) -> tuple[int, ...]:
    if not isinstance(frozen, Mapping):
        check_int(
            frozen,
            "frozen",
            minimum=0,
            message=f"frozen must be a non-negative int (or a dict name -> "
            f"count for a dict model), but got {frozen!r}.",
        )
        return tuple(frozen for _ in nets)
    if nets == ("",):
        raise EstimateError(f"frozen must be a non-negative int (a dict only for a dict model), but got {frozen!r}.")
    message = f"frozen must map network names {list(nets)!r} to non-negative ints, but got {dict(frozen)!r}."
    if any(k not in nets for k in frozen):
        raise EstimateError(message)
    return tuple(check_int(frozen.get(n, 0), "frozen", minimum=0, message=message) for n in nets)


def make_spec(
    model: Any,
    input_shape: Any,
    *,
    training: bool,
    batch_size: Any,
    input_dtype: Any,
    optimizer: Any,
    dtype: Any,
    autocast: Any,
    accumulation_steps: Any,
    frozen: Any,
    device: Any,
    scheduler: Any = None,
) -> Spec:
    """The checked ``Spec`` of a call of ``torch_training``/``torch_inference``; raises ``EstimateError``
    naming the argument and the value given. ``batch_size`` is checked, not kept (the cache fits over it)."""
    check_count(check_int(batch_size, "batch_size", minimum=1), "batch_size", "dimension")
    check_int(accumulation_steps, "accumulation_steps", minimum=1)
    if not isinstance(device, str) or not (
        device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())
    ):
        raise EstimateError(f"device must be 'cpu', 'cuda' or 'cuda:N', but got {device!r}.")
    if isinstance(model, Mapping):
        if not model:
            raise EstimateError("model must name at least one network, but got an empty dict.")
        nets = tuple(model)
        if not all(isinstance(n, str) for n in nets):
            raise EstimateError(f"model dict keys must be network names (str), but got {nets!r}.")
    elif callable(model):
        nets = ("",)
    else:
        raise EstimateError(
            f"model must be a factory returning an nn.Module, an nn.Module, or a dict of them, "
            f"but got {type(model).__name__}."
        )
    if isinstance(input_shape, Mapping):
        missing = [n for n in nets if n not in input_shape]
        if missing or nets == ("",):
            raise EstimateError(
                f"input_shape as a dict must give a shape for every network {list(nets)!r}, "
                f"but got keys {list(input_shape)!r}."
            )
        shapes = tuple(_check_shapes(input_shape[n], f"input_shape[{n!r}]") for n in nets)
    else:
        one = _check_shapes(input_shape, "input_shape")
        shapes = tuple(one for _ in nets)
    frozen_t = _check_frozen(frozen, nets)
    from .optimizers import resolve_optimizer, resolve_scheduler

    opt_name, opt_class, opt_kwargs = resolve_optimizer(optimizer)
    sched, sched_kwargs = resolve_scheduler(scheduler)
    return Spec(
        training=training,
        nets=nets,
        input_shapes=shapes,
        input_dtype=_check_dtype(input_dtype, _INPUT_DTYPES, "input_dtype"),
        dtype=_check_dtype(dtype, _FLOAT_DTYPES, "dtype"),
        optimizer=opt_name,
        optimizer_kwargs=opt_kwargs,
        autocast=None if autocast is None else _check_dtype(autocast, _AUTOCAST_DTYPES, "autocast"),
        accumulation_steps=accumulation_steps,
        frozen=frozen_t,
        cuda=device != "cpu",
        optimizer_class=opt_class,
        scheduler=sched,
        scheduler_kwargs=sched_kwargs,
    )
