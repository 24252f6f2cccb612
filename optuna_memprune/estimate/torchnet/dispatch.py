"""The storage counter: a TorchDispatchMode that records every tensor storage of a traced step as plain data.

Owns the named categories and phases of a trace (``Category``, ``Phase``, shared by the whole tracer) and the
counting itself; knows nothing of networks, batch sizes, caches or footprints.
"""

from __future__ import annotations

import enum
import functools
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..footprint import Kind
from .workspaces import channel_block, workspace_features

__all__ = ["Category", "Phase", "StorageCounter", "StandInScalars"]


class Category(enum.IntEnum):
    """What a storage holds. The value indexes per-category arrays; ``label`` suffixes component names."""

    WEIGHTS = 0
    FROZEN_WEIGHTS = 1
    GRADIENTS = 2
    OPTIMIZER_STATE = 3
    ACTIVATIONS = 4
    TEMPORARIES = 5
    KERNEL_WORKSPACES = 6

    @property
    def label(self) -> str:
        """``"frozen weights"``, ``"optimizer state"``...: the component name's suffix."""
        return self.name.lower().replace("_", " ")

    @property
    def kind(self) -> Kind:
        """The footprint ``Kind`` of the category's component."""
        return _KINDS[self]


_KINDS = (
    Kind.WEIGHTS,
    Kind.WEIGHTS,
    Kind.GRADIENTS,
    Kind.OPTIMIZER,
    Kind.ACTIVATIONS,
    Kind.TEMPORARIES,
    Kind.TEMPORARIES,
)


class Phase(enum.IntEnum):
    """Phases of the traced step: where a storage was allocated decides its category."""

    OTHER = 0
    TARGET = 1  # frozen copies' forward and their batch
    FORWARD = 2
    BACKWARD = 3
    OPTIMIZER = 4


class StorageCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves the mode unannotated
    """Counts live storages (not tensors: views share a storage) after every op, on any device.

    A storage is seen when an op returns a tensor on it; its death is seen through a weakref on its
    Python ``UntypedStorage`` object, which torch keeps alive exactly as long as the C++ storage (the
    trick of ``torch/distributed/_tools/mem_tracker.py``). The record is plain data: per storage, its
    bytes, category, allocation phase and device; and the event order (``r`` = alloc, ``~r`` = free).
    """

    def __init__(self, device_type: str, *, workspaces: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated
        self.device_type = device_type
        self.block = channel_block() if workspaces else 0  # 0: no kernel workspace records
        self.sizes: list[int] = []
        self.rules: list[int] = []  # per record: workspace rule (WORKSPACE_RULES), -1 for storages
        self.cats: list[int] = []
        self.phases: list[int] = []
        self.host: list[bool] = []
        self.owners: list[int] = []  # network index of persistent storages, -1 for the rest
        self.events: list[int] = []
        self.registered = 0
        self.prev_grad: dict[int, int] = {}  # param index -> record of its grad before the step
        self.new_grad: dict[int, int] = {}  # param index -> record of its grad after the step
        self.phase = Phase.OTHER
        self.recording = True
        self._live: dict[int, int] = {}  # id(storage) -> record
        self._refs: dict[int, Any] = {}  # id(storage) -> weakref (kept so callbacks fire)

    # -- records --
    def _freed(self, key: int, _ref: Any) -> None:
        rec = self._live.pop(key, None)
        self._refs.pop(key, None)
        if rec is not None and self.recording:
            self.events.append(~rec)

    def _new(self, st: Any, key: int, nbytes: int, cat: int, device: Any) -> int:
        rec = self._record(nbytes, cat, -1, device.type != self.device_type)
        self._live[key] = rec
        if key not in self._refs:
            self._refs[key] = weakref.ref(st, functools.partial(self._freed, key))
        self.events.append(rec)
        return rec

    def _record(self, nbytes: int, cat: int, rule: int, host: bool) -> int:
        rec = len(self.sizes)
        self.sizes.append(nbytes)
        self.rules.append(rule)
        self.cats.append(cat)
        self.phases.append(self.phase)
        self.host.append(host)
        self.owners.append(-1)
        return rec

    def workspaces(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> None:
        """Records of the op's kernel workspaces: allocated after its outputs, freed as it returns."""
        recs = [
            self._record(nbytes, Category.KERNEL_WORKSPACES, rule, False)
            for rule, nbytes in workspace_features(func, args, kwargs, out, self.block)
        ]
        self.events.extend(recs)
        self.events.extend(~r for r in recs)

    def see(self, t: Any, cat: int = Category.TEMPORARIES) -> int | None:
        """Record the storage of ``t`` if new (or resized); return its record."""
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, opaque tensors
            return None
        key = id(st)
        rec = self._live.get(key)
        nbytes = st.nbytes()
        if rec is not None:
            if nbytes == self.sizes[rec]:
                return rec
            self.events.append(~rec)  # resized in place: the old block goes, a new one comes
            cat = self.cats[rec]
        return self._new(st, key, nbytes, cat, t.device)

    def register(self, t: Any, cat: int, owner: int) -> int | None:
        """Record a storage that exists before the step (weights, gradients, optimizer state) of network ``owner``."""
        rec = self.see(t, cat)
        if rec is not None:
            self.owners[rec] = owner
        self.registered = len(self.sizes)
        return rec

    # -- categories --
    def start_backward(self) -> None:
        """Storages allocated in this forward and still alive now are the activations."""
        for rec in list(self._live.values()):
            if self.phases[rec] == Phase.FORWARD and self.cats[rec] == Category.TEMPORARIES:
                self.cats[rec] = Category.ACTIVATIONS

    def tag_grads(self, params: Sequence[Any], first: int, owner: int) -> None:
        """The parameters' gradients after backward are gradients of network ``owner``."""
        for i, p in enumerate(params):
            if p.grad is not None:
                rec = self.see(p.grad)
                if rec is not None:
                    self.cats[rec] = Category.GRADIENTS
                    self.owners[rec] = owner
                    self.new_grad[first + i] = rec

    def finish(self) -> None:
        """Stop recording. Storages the optimizer allocated and kept are optimizer state."""
        for rec in list(self._live.values()):
            if self.phases[rec] == Phase.OPTIMIZER and self.cats[rec] == Category.TEMPORARIES:
                self.cats[rec] = Category.OPTIMIZER_STATE
        self.recording = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if str(func) == _SCALAR_READ and args[0].dtype == torch.bool and _holds_no_value(args[0]):
            # A condition read back from a tensor (``if mask.all():``, Hugging Face's check that a padding
            # mask masks nothing): taken as holding, as for a batch of valid, unpadded samples.
            return True
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.see(out)
        else:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.see(t)
        if self.block and self.recording:
            self.workspaces(func, args, kwargs or {}, out)
        return out


_SCALAR_READ = "aten._local_scalar_dense.default"  # the op behind .item(), float(t), bool(t)


class StandInScalars(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves the mode unannotated
    """Gives 1 for a scalar read from a tensor that holds no value (meta or fake), under an optimizer's step.

    Some optimizers read scalars back from their state or from norms (``ASGD``: ``mu.item() != 1``; torch's
    ``Adafactor``: step counts and parameter norms scale the update). The values steer arithmetic on Python
    numbers, not which tensors are made; 1 is what ASGD's ``mu`` and ``eta`` hold under their defaults, so
    the branch taken is the real one. Used only around ``optimizer.step()``, never around a network.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch leaves TorchDispatchMode.__init__ unannotated

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if str(func) == _SCALAR_READ and _holds_no_value(args[0]):
            t = args[0]
            return True if t.dtype == torch.bool else (1.0 if t.is_floating_point() else 1)
        return func(*args, **(kwargs or {}))


def _holds_no_value(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return t.device.type == "meta" or isinstance(t, FakeTensor)
