"""The optimizer and learning-rate scheduler of a traced step, as the user names them, resolved and built.

Owns the accepted forms (a name, a class, an instance, a pair ``(name or class, kwargs)``), the checks and
error messages, the per-device ``foreach`` default and the building on the traced parameters; knows nothing
of tracing, caching or footprints.

Every ``torch.optim`` optimizer is accepted by its class name, case-insensitively (``"adagrad"``,
``"NAdam"``), and any ``torch.optim.Optimizer`` subclass (a library's Adafactor, SB3's RMSpropTFLike) as a
class or an instance. Two cannot run on the meta device and are refused with the reason: ``LBFGS`` (its
``step`` tests tensor values to decide how often to re-run the closure) and ``SparseAdam`` (sparse gradients
only).

Examples:
    >>> resolve_optimizer("adagrad")[:2]
    ('adagrad', 'Adagrad')
    >>> resolve_optimizer(("sgd", {"momentum": 0}))[2]
    (('lr', 0.001), ('momentum', 0))
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ...exceptions import EstimateError

__all__ = ["resolve_optimizer", "resolve_scheduler", "make_optimizer", "make_scheduler", "step_scheduler"]

# What a *name* brings besides torch's defaults: lr 1e-3 for all, and momentum 0.9 for SGD so that "sgd" has
# state (pass ("sgd", {"momentum": 0}) for torch's plain SGD). A class or an instance gets torch's defaults.
_NAME_DEFAULTS: dict[str, dict[str, Any]] = {"sgd": {"lr": 1e-3, "momentum": 0.9}}
_LR = {"lr": 1e-3}
_UNTRACEABLE = {
    "LBFGS": "its step() re-runs the closure while tensor values (loss and gradient tests) say so, and the meta "
    "device holds no values; its state is 2 x history_size flat copies of the parameters plus a few "
    "more: trace with optimizer=None and add that by hand",
    "SparseAdam": "it takes sparse gradients only (nn.Embedding(sparse=True)), which the traced step does not "
    "make; trace with optimizer='adam' for an upper bound",
}
_KWARG_MESSAGE = "a pair (name or class, kwargs dict)"


def _torch_optimizers() -> dict[str, type]:
    import torch

    base = torch.optim.Optimizer
    return {
        n.lower(): c
        for n in dir(torch.optim)
        if isinstance(c := getattr(torch.optim, n), type) and issubclass(c, base) and c is not base
    }


def _hashable(kwargs: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    items = tuple(sorted(kwargs.items()))
    try:
        hash(items)
    except TypeError:
        items = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
    return items


def resolve_optimizer(optimizer: Any) -> tuple[str | None, Any, tuple[tuple[str, Any], ...]]:
    """``(name, class or torch.optim class name, kwargs)`` of the user's ``optimizer``, or ``(None, None, ())``.

    ``optimizer``: ``None``, a ``torch.optim`` class name, an ``Optimizer`` subclass, an ``Optimizer``
    instance (its class and its ``defaults``: the kwargs it was built with), or a pair ``(name or class,
    kwargs)``. A name resolves to the class's *name* (the spec stays free of objects); a class outside
    ``torch.optim`` is kept as the class. Raises ``EstimateError`` naming what was expected.
    """
    import torch

    if optimizer is None:
        return None, None, ()
    base = torch.optim.Optimizer
    kwargs: dict[str, Any] = {}
    what = optimizer
    if isinstance(optimizer, base):
        what = type(optimizer)
        takes = inspect.signature(what.__init__).parameters
        open_ended = any(p.kind is p.VAR_KEYWORD for p in takes.values())
        kwargs = {
            k: v
            for k, v in optimizer.defaults.items()  # defaults may hold more than __init__ takes
            if (open_ended or k in takes) and not (k in ("foreach", "fused") and v is None)
        }
    elif isinstance(optimizer, tuple) and len(optimizer) == 2 and isinstance(optimizer[1], Mapping):
        what, kwargs = optimizer[0], dict(optimizer[1])
    known = _torch_optimizers()
    if isinstance(what, str) and what.lower() in known:
        cls = known[what.lower()]
        kwargs = {**_NAME_DEFAULTS.get(what.lower(), _LR), **kwargs}
    elif isinstance(what, type) and issubclass(what, base) and what is not base:
        cls = what
    else:
        names = ", ".join(
            repr(c.__name__)
            for c in sorted(known.values(), key=lambda c: c.__name__.lower())
            if c.__name__ not in _UNTRACEABLE
        )
        raise EstimateError(
            f"optimizer must be a torch.optim optimizer ({names}; by name, class or instance), "
            f"{_KWARG_MESSAGE} or None, but got {optimizer!r}."
        )
    if cls.__name__ in _UNTRACEABLE and getattr(torch.optim, cls.__name__, None) is cls:
        raise EstimateError(
            f"optimizer {cls.__name__} cannot be traced on the meta device: {_UNTRACEABLE[cls.__name__]}."
        )
    in_torch = getattr(torch.optim, cls.__name__, None) is cls
    return cls.__name__.lower(), cls.__name__ if in_torch else cls, _hashable(kwargs)


def resolve_scheduler(scheduler: Any) -> tuple[Any, tuple[tuple[str, Any], ...]]:
    """``(class or torch.optim.lr_scheduler class name, kwargs)`` of the user's ``scheduler``, or ``(None, ())``.

    ``scheduler``: ``None``, a class name of ``torch.optim.lr_scheduler`` (``"StepLR"``), an ``LRScheduler``
    or ``ReduceLROnPlateau`` subclass, or a pair ``(name or class, kwargs)`` (``("StepLR", {"step_size": 7})``).
    """
    from torch.optim import lr_scheduler

    if scheduler is None:
        return None, ()
    what, kwargs = scheduler, {}
    if isinstance(scheduler, tuple) and len(scheduler) == 2 and isinstance(scheduler[1], Mapping):
        what, kwargs = scheduler[0], dict(scheduler[1])
    bases = (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau)
    cls = getattr(lr_scheduler, what, None) if isinstance(what, str) else what
    if not isinstance(cls, type) or not issubclass(cls, bases) or cls is lr_scheduler.LRScheduler:
        raise EstimateError(
            f"scheduler must be a torch.optim.lr_scheduler class (by name or class), "
            f"{_KWARG_MESSAGE} or None, but got {scheduler!r}."
        )
    name = cls.__name__
    return name if getattr(lr_scheduler, name, None) is cls else cls, _hashable(kwargs)


def _class(name_or_class: Any, module: Any) -> Any:
    return getattr(module, name_or_class) if isinstance(name_or_class, str) else name_or_class


def make_optimizer(
    name: str, cls: Any, kwargs: tuple[tuple[str, Any], ...], params: list[Any], foreach: bool | None
) -> Any:
    """The optimizer on ``params``; ``foreach`` is passed where the class takes it and the user gave none."""
    import torch

    cls = _class(cls, torch.optim)
    kw = dict(kwargs)
    if kw.get("fused") and any(p.device.type == "meta" for p in params):
        # torch's fused kernels refuse meta tensors. They update each parameter in one kernel with no
        # temporaries; the single-tensor loop, traced instead, keeps one parameter's temporaries at a time.
        kw.update(fused=False, foreach=False)
    if "foreach" in inspect.signature(cls.__init__).parameters and not kw.get("fused"):
        kw.setdefault("foreach", foreach)
    try:
        return cls(params, **kw)
    except (TypeError, ValueError) as e:
        raise EstimateError(f"optimizer {name!r} rejected its kwargs {kw!r}: {e}") from e


def make_scheduler(cls: Any, kwargs: tuple[tuple[str, Any], ...], optimizer: Any) -> Any:
    """The scheduler on ``optimizer`` (``None`` without one)."""
    if cls is None or optimizer is None:
        return None
    from torch.optim import lr_scheduler

    cls = _class(cls, lr_scheduler)
    try:
        return cls(optimizer, **dict(kwargs))
    except (TypeError, ValueError, KeyError) as e:
        raise EstimateError(f"scheduler {cls.__name__!r} rejected its kwargs {dict(kwargs)!r}: {e}") from e


def step_scheduler(scheduler: Any) -> None:
    """One scheduler step after the optimizer's, as a training loop does (a plateau scheduler gets 0.0 as
    its metric: the meta device holds no loss value, and the value changes no memory)."""
    if scheduler is None:
        return
    from torch.optim import lr_scheduler

    if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
        scheduler.step(0.0)
    else:
        scheduler.step()
