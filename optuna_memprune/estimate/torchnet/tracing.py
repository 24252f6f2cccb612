"""Building the networks on the trace device and running one step under the storage counter.

Owns the step driver (``Session``: networks and optimizers built once, traced at any batch size), the
architecture's cache key and ``trace()``; knows nothing of caching over batch sizes, calibration or footprints.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from ...exceptions import EstimateError
from .analysis import Structure, Trace, positions
from .construct import call_factory
from .dispatch import Category, Phase, StandInScalars, StorageCounter
from .optimizers import make_optimizer, make_scheduler, step_scheduler
from .spec import make_spec

if TYPE_CHECKING:
    from .spec import Spec

__all__ = ["DEVICE_LOCK", "Session", "arch_key", "build", "trace"]

# ``with torch.device(...)`` pushes a thread-local mode but also sets a process-global
# (torch.utils._device.CURRENT_DEVICE) and restores it on exit: interleaved in two threads, the restores
# would cross. Every such block here holds this lock.
DEVICE_LOCK = threading.RLock()


def _torch_dtype(name: str) -> Any:
    return getattr(torch, name)


def _copy_module(module: Any, make: Callable[[Any], Any]) -> Any:
    """Deep copy of ``module`` whose parameters and buffers are ``make(t)``: data is never read or copied."""
    memo: dict[int, Any] = {}
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) not in memo:
            new = make(t)
            memo[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
    return copy.deepcopy(module, memo)


def build(model: Any, net: str, device: str, dtype: str | None = None) -> Any:
    """A private copy of network ``net`` of ``model`` on ``device`` ("meta", "fake": under a FakeTensorMode, or
    "cpu": real), its floating parameters in ``dtype``; ``dtype=None`` returns the module as built, maybe
    shared, for reading only.

    A factory is called on meta (``construct.call_factory``; ``"cpu"`` for the other two); what it returns is
    copied (parameters re-created empty on the device, data never read) unless only read: factories may hand
    out a shared module (a recipe's cached meta policy), and a trace sets gradients and optimizer state.
    """
    source = model[net] if isinstance(model, Mapping) else model
    label = f"model[{net!r}]" if isinstance(model, Mapping) else "model"
    if isinstance(source, nn.Module):
        module = source
    elif callable(source):
        with DEVICE_LOCK:
            if device == "meta":
                module = call_factory(source, label)
            else:
                with torch.device("cpu"):
                    module = source()
        if not isinstance(module, nn.Module):
            raise EstimateError(
                f"{label} must be a factory returning a torch.nn.Module, but it returned {type(module).__name__}."
            )
    else:
        raise EstimateError(
            f"{label} must be a factory returning an nn.Module or an nn.Module, but got {type(source).__name__}."
        )
    if dtype is None:
        return module
    if device == "cpu":
        if module is source or any(t.device.type != "cpu" for t in module.parameters()):
            module = _copy_module(module, lambda t: torch.zeros_like(t, device="cpu"))
    else:
        module = _copy_module(module, lambda t: torch.empty_like(t, device="meta" if device == "meta" else "cpu"))
    want = _torch_dtype(dtype)
    if any(p.is_floating_point() and p.dtype != want for p in module.parameters()):
        module = module.to(want)
    return module


def arch_key(model: Any, spec: Spec) -> tuple[str, tuple[Any, ...]]:
    """Cache key of the architecture: type, repr and parameter/buffer shapes of each network.

    A module instance is read as it is; a factory is called under ``torch.device("meta")``.
    """
    parts = []
    for net in spec.nets:
        m = build(model, net, "meta")
        shapes = tuple((n, tuple(t.shape), str(t.dtype), t.requires_grad) for n, t in m.named_parameters()) + tuple(
            (n, tuple(t.shape), str(t.dtype)) for n, t in m.named_buffers()
        )
        parts.append((net, type(m).__module__, type(m).__qualname__, repr(m), shapes))
    return ("derived", tuple(parts))


@dataclass
class _Net:
    index: int
    name: str
    module: Any
    params: list[Any]
    frozen: list[Any]
    optimizer: Any
    scheduler: Any
    shapes: tuple[tuple[int, ...], ...]
    first: int  # index of its first parameter in the step's numbering


def _make_optimizer(spec: Spec, params: list[Any]) -> Any:
    if spec.optimizer is None or spec.optimizer_class is None or not params:
        return None
    return make_optimizer(spec.optimizer, spec.optimizer_class, spec.optimizer_kwargs, params, spec.foreach)


def _no_memory_device(model: Any, spec: Spec) -> str:
    """ "fake" (FakeTensorMode CPU tensors) or "meta": where a step is traced without memory.

    Plain meta tensors are the fastest, and give the same storages as real tensors wherever torch runs the
    same kernels on both. It does not for RNNs (CPU batches the input projection and may call oneDNN) and
    attention (CPU picks its own fused SDPA kernel, and the fast path of nn.MultiheadAttention): for a CPU
    target with such modules, and for autocast (which meta lacks), fake CPU tensors reproduce the CPU's
    choices on meta storage. GPU targets always use meta: CUDA's choices (cuDNN, flash attention) cannot be
    reproduced without CUDA.
    """
    if spec.autocast is not None:
        return "fake"
    if spec.cuda:
        return "meta"
    cpu_specific = (nn.RNNBase, nn.MultiheadAttention)
    for net in spec.nets:
        module = build(model, net, "meta")
        if any(isinstance(m, cpu_specific) for m in module.modules()):
            return "fake"
    return "meta"


def trace(
    model: Any,
    input_shape: Any,
    *,
    batch_size: int,
    training: bool = True,
    input_dtype: str = "float32",
    optimizer: Any = "adam",
    dtype: str = "float32",
    autocast: str | None = None,
    accumulation_steps: int = 1,
    frozen: Any = 0,
    target: str = "cpu",
    device: str | None = None,
    scheduler: Any = None,
) -> Trace:
    """Run one step under the counter and return the trace; for tests and benchmarks.

    The same driver and counter as the public functions. ``device``: ``None`` traces without memory as the
    public functions do for ``target`` (see ``_no_memory_device``), ``"meta"`` or ``"fake"`` force one of
    those, ``"cpu"`` runs the step on real CPU tensors (the ground truth the meta trace is checked against).
    ``target`` ("cpu"/"cuda") picks the optimizer's ``foreach`` default and the no-memory device.
    """
    spec = make_spec(
        model,
        input_shape,
        training=training,
        batch_size=batch_size,
        input_dtype=input_dtype,
        optimizer=optimizer if training else None,
        dtype=dtype,
        autocast=autocast,
        accumulation_steps=accumulation_steps,
        frozen=frozen,
        device=target,
        scheduler=scheduler,
    )
    return Session(model, spec, device).trace(batch_size)


class Session:
    """Networks and optimizers built once on the trace device, traced at one or more batch sizes."""

    def __init__(self, model: Any, spec: Spec, device: str | None = None) -> None:
        if device not in (None, "meta", "cpu", "fake"):
            raise EstimateError(f"trace device must be None, 'meta', 'fake' or 'cpu', but got {device!r}.")
        self.spec = spec
        self.fake_mode = None
        if device is None:
            device = _no_memory_device(model, spec)
        if device == "meta" and spec.autocast is not None:
            device = "fake"  # the meta device has no autocast
        if device == "fake":
            from torch._subclasses.fake_tensor import FakeTensorMode

            self.fake_mode = FakeTensorMode()
        self.device = device
        self.tensor_device = "meta" if device == "meta" else "cpu"
        with self._mode():
            self.nets = self._build_nets(model)
            if spec.training:
                self._warm_up()

    def _mode(self) -> Any:
        return self.fake_mode if self.fake_mode is not None else contextlib.nullcontext()

    def _build_nets(self, model: Any) -> list[_Net]:
        nets, first = [], 0
        for i, name in enumerate(self.spec.nets):
            module = build(model, name, self.device, self.spec.dtype)
            if self.spec.training:
                module.train()
            else:
                module.eval()
            frozen = []
            for _ in range(self.spec.frozen[i] if self.spec.training else 0):
                copy_ = _copy_module(module, lambda t: t.detach().clone())
                for p in copy_.parameters():
                    p.requires_grad_(False)
                frozen.append(copy_.eval())
            params = [p for p in module.parameters() if p.requires_grad]
            opt = _make_optimizer(self.spec, params) if self.spec.training else None
            sched = make_scheduler(self.spec.scheduler, self.spec.scheduler_kwargs, opt)
            nets.append(_Net(i, name, module, params, frozen, opt, sched, self.spec.input_shapes[i], first))
            first += len(params)
        return nets

    def _warm_up(self) -> None:
        """Bring the step to steady state: gradients of a previous step exist, the optimizer has its state."""
        for net in self.nets:
            for p in net.params:
                p.grad = torch.zeros_like(p)
            if net.optimizer is not None:
                with StandInScalars():
                    net.optimizer.step()
                step_scheduler(net.scheduler)

    # -- the step --
    def _batch(self, net: _Net, batch_size: int) -> list[Any]:
        dt = _torch_dtype(self.spec.input_dtype)
        return [torch.zeros((batch_size, *shape), dtype=dt, device=self.tensor_device) for shape in net.shapes]

    def _prepare(self, batch: list[Any]) -> list[Any]:
        want = _torch_dtype(self.spec.dtype)
        out = []
        for x in batch:
            if x.dtype == torch.uint8:
                x = x.float() / 255.0
            if x.is_floating_point() and x.dtype != want and self.spec.autocast is None:
                x = x.to(want)
            out.append(x)
        return out

    def _autocast(self) -> Any:
        if self.spec.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast("cpu", dtype=_torch_dtype(self.spec.autocast))

    @staticmethod
    def _loss(out: Any) -> Any:
        leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not leaves:
            raise EstimateError("the model's output has no tensor that requires grad; nothing to train.")
        loss = leaves[0].float().mean()
        for t in leaves[1:]:
            loss = loss + t.float().mean()
        return loss

    def _training_step(self, counter: StorageCounter, batch_size: int) -> None:
        for net in self.nets:
            held = None
            for micro in range(self.spec.accumulation_steps):
                # A sampled batch (DQN's replay sample: observations, and next observations for the
                # target network); the previous micro-step's locals go once it exists, as in a loop.
                counter.phase = Phase.TARGET
                tbatch = self._batch(net, batch_size) if net.frozen else None
                counter.phase = Phase.FORWARD
                batch = self._batch(net, batch_size)
                held = None
                counter.phase = Phase.TARGET
                targets = None
                if tbatch is not None:  # the batch of the frozen copies
                    with torch.no_grad(), self._autocast():
                        targets = [f(*self._prepare(tbatch)) for f in net.frozen]
                counter.phase = Phase.FORWARD
                with self._autocast():
                    out = net.module(*self._prepare(batch))
                    loss = self._loss(out)
                counter.start_backward()
                counter.phase = Phase.OTHER
                if micro == 0:
                    if net.optimizer is not None:
                        net.optimizer.zero_grad(set_to_none=True)
                    else:
                        for p in net.params:
                            p.grad = None
                counter.phase = Phase.BACKWARD
                loss.backward()
                counter.tag_grads(net.params, net.first, net.index)
                held = (tbatch, targets, batch, out, loss)  # alive through the optimizer step
                del tbatch, targets, batch, out, loss
            counter.phase = Phase.OPTIMIZER
            if net.optimizer is not None:
                with StandInScalars():
                    net.optimizer.step()
            counter.phase = Phase.OTHER
            step_scheduler(net.scheduler)
            del held

    def _inference_step(self, counter: StorageCounter, batch_size: int) -> None:
        counter.phase = Phase.FORWARD
        with torch.no_grad(), self._autocast():
            for net in self.nets:
                batch = self._batch(net, batch_size)
                out = net.module(*self._prepare(batch))
                del batch, out

    def trace(self, batch_size: int) -> Trace:
        """One step at ``batch_size`` under a fresh counter, as a ``Trace``."""
        counter = StorageCounter(self.tensor_device, workspaces=not self.spec.cuda)
        # Persistent storages first, in the order a training script allocates them.
        for net in self.nets:
            for t in list(net.module.parameters()) + list(net.module.buffers()):
                counter.register(t, Category.WEIGHTS, net.index)
            for f in net.frozen:
                for t in list(f.parameters()) + list(f.buffers()):
                    counter.register(t, Category.FROZEN_WEIGHTS, net.index)
        for net in self.nets:
            for i, p in enumerate(net.params):
                if p.grad is not None:
                    rec = counter.register(p.grad, Category.GRADIENTS, net.index)
                    if rec is not None:
                        counter.prev_grad[net.first + i] = rec
        for net in self.nets:
            if net.optimizer is not None:
                for state in net.optimizer.state.values():
                    for v in state.values():
                        if hasattr(v, "untyped_storage"):
                            counter.register(v, Category.OPTIMIZER_STATE, net.index)
        with DEVICE_LOCK, self._mode(), counter:
            with torch.device(self.tensor_device):
                if self.spec.training:
                    self._training_step(counter, batch_size)
                else:
                    self._inference_step(counter, batch_size)
        counter.finish()
        events = np.asarray(counter.events, dtype=np.int64)
        n = len(counter.sizes)
        structure = Structure(
            cats=np.asarray(counter.cats, dtype=np.int64),
            rules=np.asarray(counter.rules, dtype=np.int64),
            host=np.asarray(counter.host, dtype=bool),
            owners=np.asarray(counter.owners, dtype=np.int64),
            n_nets=len(self.nets),
            events=events,
            registered=counter.registered,
            prev_grad=tuple(sorted(counter.prev_grad.items())),
            new_grad=tuple(sorted(counter.new_grad.items())),
            alloc_pos=positions(events, n, alloc=True),
            free_pos=positions(events, n, alloc=False),
        )
        return Trace(structure, np.asarray(counter.sizes, dtype=np.int64), batch_size, self.device)
