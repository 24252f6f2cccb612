"""Training and inference steps of torch networks traced on the meta device, counted as tensor-level peaks.

Owns the storage counter, the step driver, the trace cache, and for CPU targets the kernel-workspace rules and
the glibc heap model; must not know Optuna, psutil or recipes.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ...exceptions import EstimateError
from .. import allocator as _alloc
from ..footprint import Component, Footprint, Kind
from .workspaces import WORKSPACE_RULES, channel_block, workspace_features

__all__ = ["torch_training", "torch_inference"]

# --- Categories of storages. Indices into per-category arrays; names double as component suffixes. ---
_W, _FW, _G, _O, _A, _T, _K = range(7)
_N_CATS = 7
_CAT_NAMES = ("weights", "frozen weights", "gradients", "optimizer state", "activations", "temporaries",
              "kernel workspaces")
_CAT_KINDS = (Kind.WEIGHTS, Kind.WEIGHTS, Kind.GRADIENTS, Kind.OPTIMIZER, Kind.ACTIVATIONS, Kind.TEMPORARIES,
              Kind.TEMPORARIES)

# --- Phases of the traced step: where a storage was allocated decides its category. ---
_OTHER, _TARGET, _FWD, _BWD, _OPT = range(5)

_FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
_INPUT_DTYPES = _FLOAT_DTYPES + ("uint8", "int8", "int16", "int32", "int64", "bool")
_AUTOCAST_DTYPES = ("float16", "bfloat16")
# Optimizer name -> (torch.optim class name, default kwargs). SGD gets momentum 0.9 so it has state; pass
# ("sgd", {"momentum": 0}) for plain SGD. ``foreach`` defaults per target device (see _Spec.foreach).
_OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd": ("SGD", {"lr": 1e-3, "momentum": 0.9}),
    "adam": ("Adam", {"lr": 1e-3}),
    "adamw": ("AdamW", {"lr": 1e-3}),
    "rmsprop": ("RMSprop", {"lr": 1e-3}),
}
# Batch sizes of the two traces a linear model is fitted on, and of the trace that checks it.
_FIT_BATCHES = (2, 4)
_CHECK_BATCH = 3
# Replays of the step through the allocator model: the second one reuses the first one's cached blocks,
# as every step after the first does on a real GPU.
_ALLOCATOR_STEPS = 2
_CACHE_SIZE = 256
_EXACT_PER_ENTRY = 32
# ``with torch.device(...)`` pushes a thread-local mode but also sets a process-global
# (torch.utils._device.CURRENT_DEVICE) and restores it on exit: interleaved in two threads, the restores
# would cross. Every such block here holds this lock.
_DEVICE_LOCK = threading.RLock()

_KERNEL_NOTE = "oneDNN buffers outside the dispatcher, calibrated on this host"


# ----------------------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------------------
def torch_training(
    model: Any,
    input_shape: Any,
    *,
    batch_size: int,
    input_dtype: str = "float32",
    optimizer: str | tuple[str, Mapping[str, Any]] | None = "adam",
    dtype: str = "float32",
    autocast: str | None = None,
    accumulation_steps: int = 1,
    frozen: int | Mapping[str, int] = 0,
    device: str = "cpu",
    cache_key: Any = None,
    name: str = "network",
    calibration: Any = None,
) -> Footprint:
    """Peak memory of one training step of a torch network, traced on the meta device.

    The step is what SB3 and most training loops run, in steady state (the optimizer state already exists
    and the previous step's gradients are still alive): for each trained network, its frozen copies run
    forward under ``no_grad`` on a batch of their own (DQN's target network), then ``accumulation_steps``
    times: a batch is made, the network runs forward (under autocast if asked), a scalar loss is reduced
    from its outputs, ``zero_grad(set_to_none=True)`` (first micro-step only) and ``backward``; then the
    optimizer steps. Several trained networks (a dict) are updated one after the other in the same step.
    Every tensor storage is counted after every op by a ``TorchDispatchMode``; nothing is allocated.

    Args:
        model: a zero-argument callable returning an ``nn.Module`` (called under ``torch.device("meta")``),
            an ``nn.Module`` instance (its architecture is copied to meta; its memory is never touched), or
            a dict ``{name: factory_or_module}`` of networks trained in the same step (actor, critic...).
        input_shape: the shape of one sample, batch dimension excluded, e.g. ``(4, 84, 84)``; a list of
            shapes for a model taking several inputs; for a dict model, a dict ``{name: shape(s)}``.
        batch_size: samples per (micro-)batch, a positive int.
        input_dtype: dtype of the batch as it reaches the device. ``"uint8"`` images are converted inside
            the step as SB3 does (``x.float() / 255``), so the float copy counts as an activation; other
            integer dtypes reach the model unchanged (embedding indices).
        optimizer: ``"sgd"`` (momentum 0.9 unless given), ``"adam"``, ``"adamw"``, ``"rmsprop"``, a pair
            ``(name, kwargs)`` such as ``("sgd", {"momentum": 0})``, or ``None`` for no optimizer.
        dtype: parameter dtype, ``"float32"``, ``"float16"``, ``"bfloat16"`` or ``"float64"``.
        autocast: ``None``, ``"float16"`` or ``"bfloat16"``: forward and loss under ``torch.autocast``.
            The meta device has no autocast, so these steps are traced with ``FakeTensorMode`` CPU tensors
            and CPU autocast's op lists (close to, not identical with, CUDA's). Slower to trace.
        accumulation_steps: forward/backward micro-steps of ``batch_size`` before one optimizer step.
        frozen: frozen copies (weights only, forward under ``no_grad``) per trained network, or a dict
            ``{name: count}``.
        device: ``"cpu"`` puts the bytes in ``ram``; ``"cuda"`` (or ``"cuda:N"``) replays the timeline
            through the caching-allocator model and puts the bytes in ``vram``, with the CUDA context, the
            cuBLAS workspace and the allocator's overhead as components of their own (ram 0 for all).
        cache_key: any hashable that identifies the architecture; with it a cached trace is used without
            building the module at all. By default the key is derived from the built module (repr, shapes).
        name: prefix of the component names (``"network weights"``).
        calibration: the host calibration whose CPU kernel coefficients size the kernel workspaces
            (``device="cpu"`` only); by default this environment's (``calibration.load()``, measured on first
            use, a few seconds).

    Returns:
        A Footprint with components ``<name> weights``, ``frozen weights`` (if any), ``gradients``,
        ``optimizer state`` (if any), ``activations`` and ``temporaries``: weights, gradients and state
        are their full sizes; activations (storages allocated in the forward and still alive when backward
        starts, i.e. saved for backward, plus the batch) and temporaries share the rest of the peak. They
        add up to the step's peak of live tensor bytes. For ``device="cpu"`` two host components follow:
        ``kernel workspaces`` (buffers oneDNN convolutions allocate inside the op, outside the dispatcher,
        alive at the peak; sized by coefficients calibrated on this host) and ``allocator overhead`` (what
        glibc's heap keeps resident above the live bytes; a model, see ``_HEAP_RETENTION``). Tensors,
        workspaces and overhead together predict the step's peak RSS above the process baseline.

    Notes:
        - Traces are cached per (architecture, shapes, dtypes, optimizer, autocast, accumulation, frozen,
          device kind). Per-storage sizes are fitted linear in the batch size from traces at batch 2 and 4
          and checked at 3; a network that is not linear (batch used as a sequence length) is traced at the
          exact batch size instead. A cached evaluation takes well under 5 ms with ``cache_key``; without
          one, the factory is also called on meta to derive the key (about 5 ms for NatureCNN).
        - The step order is SB3's (``zero_grad`` just before ``backward``), so the previous step's
          gradients are alive during the forward: an upper bound for loops that zero after ``step``.
        - Optimizers run with ``foreach=False`` for ``device="cpu"`` and ``foreach=True`` for ``"cuda"``,
          as torch picks by default on those devices (``foreach`` keeps whole lists of intermediates alive,
          which raises the optimizer-step peak). Meta and real CPU tensors behave identically for both.
        - Where CPU kernels differ from the generic ones (RNNs, attention) a CPU target is traced with
          ``FakeTensorMode`` CPU tensors (meta storage, CPU's kernel choices); see ``_no_memory_device``.
          GPU targets are traced on meta, so CUDA-only kernels are not reproduced: attention runs the math
          path (a (B, heads, L, L) matrix, more than flash attention keeps) and LSTMs the cell-by-cell path
          (not cuDNN's).
        - Memory a kernel allocates without dispatching is invisible to the trace. For CPU targets the
          convolutions' oneDNN buffers are added by rule (see ``WORKSPACE_RULES``; torch's default oneDNN
          backend assumed, ``torch.backends.mkldnn.enabled``); still missing: cuDNN/cuBLAS workspaces on
          GPUs, oneDNN's LSTM workspace on CPU (its meta kernel says 0 bytes), and the one-off oneDNN
          primitives of each new conv shape (0.1-2 MiB each).
        - The allocator overhead of CPU targets assumes glibc's malloc with its default dynamic mmap
          threshold (or ``MALLOC_MMAP_THRESHOLD_`` as set in this process's environment); a preloaded jemalloc
          or tcmalloc behaves otherwise. Under the default, peak RSS of identical runs differs by up to
          +-30% and creeps up over the first hundreds of steps.
        - The loss is the mean of the outputs, not the user's loss; tensors a module keeps outside its
          parameters and buffers are copied, not re-created on meta.
        - The first trace in a process pays torch's one-off warm-up (its Python meta kernels import
          ``torch._dynamo``, 1-2 s on a small machine).

    Example:
        >>> import torch.nn as nn
        >>> fp = torch_training(lambda: nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2)),
        ...                     (8,), batch_size=32)
        >>> fp.ram > 0
        True
    """
    spec = _make_spec(
        model, input_shape, training=True, batch_size=batch_size, input_dtype=input_dtype,
        optimizer=optimizer, dtype=dtype, autocast=autocast, accumulation_steps=accumulation_steps,
        frozen=frozen, device=device,
    )
    return _footprint(model, spec, batch_size, cache_key=cache_key, name=name, calibration=calibration)


def torch_inference(
    model: Any,
    input_shape: Any,
    *,
    batch_size: int,
    input_dtype: str = "float32",
    dtype: str = "float32",
    autocast: str | None = None,
    device: str = "cpu",
    cache_key: Any = None,
    name: str = "network",
    calibration: Any = None,
) -> Footprint:
    """Peak memory of one forward pass under ``no_grad`` (acting, evaluation), traced on the meta device.

    Arguments as for :func:`torch_training`. The components are ``<name> weights`` and ``<name>
    activations`` (everything above the weights at the peak: under ``no_grad`` nothing is kept for backward,
    so it is all transient), and for ``device="cpu"`` the host's ``kernel workspaces`` and ``allocator
    overhead`` where they are not zero.

    Example:
        >>> import torch.nn as nn
        >>> torch_inference(lambda: nn.Linear(8, 2), (8,), batch_size=1).components[0].name
        'network weights'
    """
    spec = _make_spec(
        model, input_shape, training=False, batch_size=batch_size, input_dtype=input_dtype, optimizer=None,
        dtype=dtype, autocast=autocast, accumulation_steps=1, frozen=0, device=device,
    )
    return _footprint(model, spec, batch_size, cache_key=cache_key, name=name, calibration=calibration)


# ----------------------------------------------------------------------------------------------------------
# Argument checking -> a hashable spec
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    """Everything but the architecture and the batch size that decides a trace; hashable."""

    training: bool
    nets: tuple[str, ...]
    input_shapes: tuple[tuple[tuple[int, ...], ...], ...]      # per net, per input
    input_dtype: str
    dtype: str
    optimizer: str | None
    optimizer_kwargs: tuple[tuple[str, Any], ...]
    autocast: str | None
    accumulation_steps: int
    frozen: tuple[int, ...]                                     # per net
    cuda: bool                                                  # target device kind

    @property
    def foreach(self) -> bool:
        return dict(self.optimizer_kwargs).get("foreach", self.cuda)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_shape(shape: Any, what: str) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)) or not all(_is_int(d) and d > 0 for d in shape):
        raise EstimateError(f"{what} must be a tuple of positive ints (batch dim excluded), but got {shape!r}.")
    return tuple(shape)


def _check_shapes(value: Any, what: str) -> tuple[tuple[int, ...], ...]:
    if isinstance(value, (tuple, list)) and value and all(isinstance(s, (tuple, list)) for s in value):
        return tuple(_check_shape(s, what) for s in value)
    return (_check_shape(value, what),)


def _check_dtype(value: Any, allowed: Sequence[str], what: str) -> str:
    text = str(value).replace("torch.", "") if value is not None else None
    if text not in allowed:
        raise EstimateError(f"{what} must be one of {', '.join(map(repr, allowed))}, but got {value!r}.")
    return text  # type: ignore[return-value]


def _make_spec(
    model: Any, input_shape: Any, *, training: bool, batch_size: Any, input_dtype: Any, optimizer: Any,
    dtype: Any, autocast: Any, accumulation_steps: Any, frozen: Any, device: Any,
) -> _Spec:
    if not _is_int(batch_size) or batch_size < 1:
        raise EstimateError(f"batch_size must be a positive int, but got {batch_size!r}.")
    if not _is_int(accumulation_steps) or accumulation_steps < 1:
        raise EstimateError(f"accumulation_steps must be a positive int, but got {accumulation_steps!r}.")
    if not isinstance(device, str) or not (device == "cpu" or device == "cuda" or (
            device.startswith("cuda:") and device[5:].isdigit())):
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
    if _is_int(frozen):
        if frozen < 0:
            raise EstimateError(f"frozen must be a non-negative int or a dict name -> count, but got {frozen!r}.")
        frozen_t = tuple(frozen for _ in nets)
    elif isinstance(frozen, Mapping) and nets != ("",):
        bad = {k: v for k, v in frozen.items() if k not in nets or not _is_int(v) or v < 0}
        if bad:
            raise EstimateError(
                f"frozen must map network names {list(nets)!r} to non-negative ints, but got {dict(frozen)!r}."
            )
        frozen_t = tuple(int(frozen.get(n, 0)) for n in nets)
    else:
        raise EstimateError(f"frozen must be a non-negative int (or a dict for a dict model), but got {frozen!r}.")
    opt_name: str | None
    kwargs: dict[str, Any]
    if optimizer is None:
        opt_name, kwargs = None, {}
    else:
        if isinstance(optimizer, tuple) and len(optimizer) == 2 and isinstance(optimizer[1], Mapping):
            opt_name, kwargs = optimizer[0], dict(optimizer[1])
        else:
            opt_name, kwargs = optimizer, {}
        if not isinstance(opt_name, str) or opt_name.lower() not in _OPTIMIZERS:
            raise EstimateError(
                f"optimizer must be one of {', '.join(map(repr, _OPTIMIZERS))}, a pair (name, kwargs) or None, "
                f"but got {optimizer!r}."
            )
        opt_name = opt_name.lower()
        kwargs = {**_OPTIMIZERS[opt_name][1], **kwargs}
    try:
        opt_kwargs = tuple(sorted(kwargs.items()))
        hash(opt_kwargs)
    except TypeError:
        opt_kwargs = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
    return _Spec(
        training=training,
        nets=nets,
        input_shapes=shapes,
        input_dtype=_check_dtype(input_dtype, _INPUT_DTYPES, "input_dtype"),
        dtype=_check_dtype(dtype, _FLOAT_DTYPES, "dtype"),
        optimizer=opt_name,
        optimizer_kwargs=opt_kwargs if opt_name is not None else (),
        autocast=None if autocast is None else _check_dtype(autocast, _AUTOCAST_DTYPES, "autocast"),
        accumulation_steps=accumulation_steps,
        frozen=frozen_t,
        cuda=device != "cpu",
    )


# ----------------------------------------------------------------------------------------------------------
# The storage counter
# ----------------------------------------------------------------------------------------------------------
class _StorageCounter(TorchDispatchMode):
    """Counts live storages (not tensors: views share a storage) after every op, on any device.

    A storage is seen when an op returns a tensor on it; its death is seen through a weakref on its
    Python ``UntypedStorage`` object, which torch keeps alive exactly as long as the C++ storage (the
    trick of ``torch/distributed/_tools/mem_tracker.py``). The record is plain data: per storage, its
    bytes, category, allocation phase and device; and the event order (``r`` = alloc, ``~r`` = free).
    """

    def __init__(self, device_type: str, *, workspaces: bool = False) -> None:
        super().__init__()
        self.device_type = device_type
        self.block = channel_block() if workspaces else 0   # 0: no kernel workspace records
        self.sizes: list[int] = []
        self.rules: list[int] = []              # per record: workspace rule (WORKSPACE_RULES), -1 for storages
        self.cats: list[int] = []
        self.phases: list[int] = []
        self.host: list[bool] = []
        self.owners: list[int] = []             # network index of persistent storages, -1 for the rest
        self.events: list[int] = []
        self.registered = 0
        self.prev_grad: dict[int, int] = {}     # param index -> record of its grad before the step
        self.new_grad: dict[int, int] = {}      # param index -> record of its grad after the step
        self.phase = _OTHER
        self.recording = True
        self._live: dict[int, int] = {}         # id(storage) -> record
        self._refs: dict[int, Any] = {}         # id(storage) -> weakref (kept so callbacks fire)

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
            self._refs[key] = weakref.ref(st, lambda r, key=key: self._freed(key, r))
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
        recs = [self._record(nbytes, _K, rule, False)
                for rule, nbytes in workspace_features(func, args, kwargs, out, self.block)]
        self.events.extend(recs)
        self.events.extend(~r for r in recs)

    def see(self, t: Any, cat: int = _T) -> int | None:
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
        rec = self.see(t, cat)
        if rec is not None:
            self.owners[rec] = owner
        self.registered = len(self.sizes)
        return rec

    # -- categories --
    def start_backward(self) -> None:
        """Storages allocated in this forward and still alive now are the activations."""
        for rec in list(self._live.values()):
            if self.phases[rec] == _FWD and self.cats[rec] == _T:
                self.cats[rec] = _A

    def tag_grads(self, params: Sequence[Any], first: int, owner: int) -> None:
        for i, p in enumerate(params):
            if p.grad is not None:
                rec = self.see(p.grad)
                if rec is not None:
                    self.cats[rec] = _G
                    self.owners[rec] = owner
                    self.new_grad[first + i] = rec

    def finish(self) -> None:
        """Stop recording. Storages the optimizer allocated and kept are optimizer state."""
        for rec in list(self._live.values()):
            if self.phases[rec] == _OPT and self.cats[rec] == _T:
                self.cats[rec] = _O
        self.recording = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
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


# ----------------------------------------------------------------------------------------------------------
# Building the networks on the trace device
# ----------------------------------------------------------------------------------------------------------
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


def _build(model: Any, net: str, device: str, dtype: str | None = None) -> Any:
    """A private copy of network ``net`` of ``model`` on ``device`` ("meta", "fake": under a FakeTensorMode, or
    "cpu": real), its floating parameters in ``dtype``; ``dtype=None`` returns the module as built, maybe
    shared, for reading only.

    A factory is called under ``torch.device("meta")`` (``"cpu"`` for the other two); what it returns is
    copied (parameters re-created empty on the device, data never read) unless only read: factories may hand
    out a shared module (a recipe's cached meta policy), and a trace sets gradients and optimizer state.
    """
    source = model[net] if isinstance(model, Mapping) else model
    label = f"model[{net!r}]" if isinstance(model, Mapping) else "model"
    if isinstance(source, nn.Module):
        module = source
    elif callable(source):
        with _DEVICE_LOCK, torch.device("meta" if device == "meta" else "cpu"):
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


def _arch_key(model: Any, spec: _Spec) -> tuple:
    """Cache key of the architecture: type, repr and parameter/buffer shapes of each network.

    A module instance is read as it is; a factory is called under ``torch.device("meta")``.
    """
    parts = []
    for net in spec.nets:
        m = _build(model, net, "meta")
        shapes = tuple((n, tuple(t.shape), str(t.dtype), t.requires_grad) for n, t in m.named_parameters()) + \
            tuple((n, tuple(t.shape), str(t.dtype)) for n, t in m.named_buffers())
        parts.append((net, type(m).__module__, type(m).__qualname__, repr(m), shapes))
    return ("derived", tuple(parts))


# ----------------------------------------------------------------------------------------------------------
# The traced step
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Structure:
    """The shape of a trace, independent of the batch size: which storages, in which order, of what kind."""

    cats: np.ndarray            # per record
    rules: np.ndarray           # per record: kernel workspace rule (WORKSPACE_RULES) or -1 for a storage
    host: np.ndarray            # per record: on another device than the traced one (CPU scalars of a meta trace)
    owners: np.ndarray          # per record: index of the network a persistent storage belongs to, else -1
    n_nets: int
    events: np.ndarray          # r >= 0 alloc of record r, ~r free
    registered: int             # records 0..registered-1 existed before the step (weights, state, grads)
    prev_grad: tuple[tuple[int, int], ...]   # (param index, record) before the step
    new_grad: tuple[tuple[int, int], ...]    # (param index, record) after the step
    alloc_pos: np.ndarray       # per record: index of its alloc event
    free_pos: np.ndarray        # per record: index of its free event, len(events) if it outlives the step

    def same_as(self, other: "_Structure") -> bool:
        """Same storages in the same order (sizes aside): the condition for a linear fit over batch sizes."""
        return (self.registered == other.registered and self.n_nets == other.n_nets
                and self.prev_grad == other.prev_grad and self.new_grad == other.new_grad
                and all(np.array_equal(getattr(self, a), getattr(other, a))
                        for a in ("cats", "rules", "host", "owners", "events")))


@dataclass(frozen=True)
class _Trace:
    """One traced step at one batch size: its structure and the bytes of every storage."""

    structure: _Structure
    sizes: np.ndarray
    batch_size: int
    device: str

    @property
    def peak(self) -> int:
        """Peak of live tensor bytes during the step (all devices the trace saw); kernel workspaces excluded."""
        return _analyse(self.structure, np.where(self.structure.rules >= 0, 0, self.sizes)).peak


@dataclass
class _Net:
    index: int
    name: str
    module: Any
    params: list
    frozen: list
    optimizer: Any
    shapes: tuple[tuple[int, ...], ...]
    first: int      # index of its first parameter in the step's numbering


def _make_optimizer(spec: _Spec, params: list) -> Any:
    if spec.optimizer is None or not params:
        return None
    cls = getattr(torch.optim, _OPTIMIZERS[spec.optimizer][0])
    kwargs = dict(spec.optimizer_kwargs)
    kwargs.setdefault("foreach", spec.foreach)
    try:
        return cls(params, **kwargs)
    except (TypeError, ValueError) as e:
        raise EstimateError(f"optimizer {spec.optimizer!r} rejected its kwargs {kwargs!r}: {e}") from e


def _no_memory_device(model: Any, spec: _Spec) -> str:
    """"fake" (FakeTensorMode CPU tensors) or "meta": where a step is traced without memory.

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
        module = _build(model, net, "meta")
        if any(isinstance(m, cpu_specific) for m in module.modules()):
            return "fake"
    return "meta"


def _trace(
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
) -> _Trace:
    """Run one step under the counter and return the trace; for tests and benchmarks.

    The same driver and counter as the public functions. ``device``: ``None`` traces without memory as the
    public functions do for ``target`` (see ``_no_memory_device``), ``"meta"`` or ``"fake"`` force one of
    those, ``"cpu"`` runs the step on real CPU tensors (the ground truth the meta trace is checked against).
    ``target`` ("cpu"/"cuda") picks the optimizer's ``foreach`` default and the no-memory device.
    """
    spec = _make_spec(
        model, input_shape, training=training, batch_size=batch_size, input_dtype=input_dtype,
        optimizer=optimizer if training else None, dtype=dtype, autocast=autocast,
        accumulation_steps=accumulation_steps, frozen=frozen, device=target,
    )
    return _Session(model, spec, device).trace(batch_size)


class _Session:
    """Networks and optimizers built once on the trace device, traced at one or more batch sizes."""

    def __init__(self, model: Any, spec: _Spec, device: str | None = None) -> None:
        if device not in (None, "meta", "cpu", "fake"):
            raise ValueError(f"trace device must be None, 'meta', 'fake' or 'cpu', but got {device!r}")
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
            module = _build(model, name, self.device, self.spec.dtype)
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
            nets.append(_Net(i, name, module, params, frozen, opt, self.spec.input_shapes[i], first))
            first += len(params)
        return nets

    def _warm_up(self) -> None:
        """Bring the step to steady state: gradients of a previous step exist, the optimizer has its state."""
        for net in self.nets:
            for p in net.params:
                p.grad = torch.zeros_like(p)
            if net.optimizer is not None:
                net.optimizer.step()

    # -- the step --
    def _batch(self, net: _Net, batch_size: int) -> list:
        dt = _torch_dtype(self.spec.input_dtype)
        return [torch.zeros((batch_size, *shape), dtype=dt, device=self.tensor_device) for shape in net.shapes]

    def _prepare(self, batch: list) -> list:
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

    def _training_step(self, counter: Any, batch_size: int) -> None:
        for net in self.nets:
            held = None
            for micro in range(self.spec.accumulation_steps):
                # A sampled batch (DQN's replay sample: observations, and next observations for the
                # target network); the previous micro-step's locals go once it exists, as in a loop.
                counter.phase = _TARGET
                tbatch = self._batch(net, batch_size) if net.frozen else None
                counter.phase = _FWD
                batch = self._batch(net, batch_size)
                held = None
                counter.phase = _TARGET
                targets = None
                if net.frozen:
                    with torch.no_grad(), self._autocast():
                        targets = [f(*self._prepare(tbatch)) for f in net.frozen]
                counter.phase = _FWD
                with self._autocast():
                    out = net.module(*self._prepare(batch))
                    loss = self._loss(out)
                counter.start_backward()
                counter.phase = _OTHER
                if micro == 0:
                    if net.optimizer is not None:
                        net.optimizer.zero_grad(set_to_none=True)
                    else:
                        for p in net.params:
                            p.grad = None
                counter.phase = _BWD
                loss.backward()
                counter.tag_grads(net.params, net.first, net.index)
                held = (tbatch, targets, batch, out, loss)  # alive through the optimizer step
                del tbatch, targets, batch, out, loss
            counter.phase = _OPT
            if net.optimizer is not None:
                net.optimizer.step()
            counter.phase = _OTHER
            del held

    def _inference_step(self, counter: Any, batch_size: int) -> None:
        counter.phase = _FWD
        with torch.no_grad(), self._autocast():
            for net in self.nets:
                batch = self._batch(net, batch_size)
                out = net.module(*self._prepare(batch))
                del batch, out

    def trace(self, batch_size: int) -> _Trace:
        counter = _StorageCounter(self.tensor_device, workspaces=not self.spec.cuda)
        # Persistent storages first, in the order a training script allocates them.
        for net in self.nets:
            for t in list(net.module.parameters()) + list(net.module.buffers()):
                counter.register(t, _W, net.index)
            for f in net.frozen:
                for t in list(f.parameters()) + list(f.buffers()):
                    counter.register(t, _FW, net.index)
        for net in self.nets:
            for i, p in enumerate(net.params):
                if p.grad is not None:
                    rec = counter.register(p.grad, _G, net.index)
                    if rec is not None:
                        counter.prev_grad[net.first + i] = rec
        for net in self.nets:
            if net.optimizer is not None:
                for state in net.optimizer.state.values():
                    for v in state.values():
                        if hasattr(v, "untyped_storage"):
                            counter.register(v, _O, net.index)
        with _DEVICE_LOCK, self._mode(), counter:
            with torch.device(self.tensor_device):
                if self.spec.training:
                    self._training_step(counter, batch_size)
                else:
                    self._inference_step(counter, batch_size)
        counter.finish()
        events = np.asarray(counter.events, dtype=np.int64)
        n = len(counter.sizes)
        structure = _Structure(
            cats=np.asarray(counter.cats, dtype=np.int64),
            rules=np.asarray(counter.rules, dtype=np.int64),
            host=np.asarray(counter.host, dtype=bool),
            owners=np.asarray(counter.owners, dtype=np.int64),
            n_nets=len(self.nets),
            events=events,
            registered=counter.registered,
            prev_grad=tuple(sorted(counter.prev_grad.items())),
            new_grad=tuple(sorted(counter.new_grad.items())),
            alloc_pos=_positions(events, n, alloc=True),
            free_pos=_positions(events, n, alloc=False),
        )
        return _Trace(structure, np.asarray(counter.sizes, dtype=np.int64), batch_size, self.device)


def _positions(events: np.ndarray, n: int, *, alloc: bool) -> np.ndarray:
    """Event index of each record's allocation (or free; len(events) when never freed)."""
    pos = np.full(n, len(events), dtype=np.int64)
    idx = np.nonzero(events >= 0)[0] if alloc else np.nonzero(events < 0)[0]
    recs = events[idx] if alloc else ~events[idx]
    pos[recs] = idx
    return pos


# ----------------------------------------------------------------------------------------------------------
# Analysis: peak and breakdown from a structure and sizes
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Peak:
    peak: int
    at_peak: tuple[int, ...]                # live bytes per category at the peak
    final: tuple[tuple[int, ...], ...]      # per network, live bytes per category after the step (persistent)

    def persistent(self, cat: int) -> int:
        return sum(f[cat] for f in self.final)


def _analyse(structure: _Structure, sizes: np.ndarray, *, device_only: bool = False) -> _Peak:
    """Peak of live bytes over the event timeline, the per-category split at the peak, and what persists."""
    ev = structure.events
    if device_only:
        sizes = np.where(structure.host, 0, sizes)
    recs = np.where(ev >= 0, ev, ~ev)
    delta = np.where(ev >= 0, sizes[recs], -sizes[recs])
    totals = np.cumsum(delta)
    k = int(np.argmax(totals)) if len(totals) else 0
    peak = int(totals[k]) if len(totals) else 0
    live = (structure.alloc_pos <= k) & (structure.free_pos > k)
    at_peak = np.bincount(structure.cats[live], weights=sizes[live], minlength=_N_CATS)
    alive = structure.free_pos >= len(ev)
    owner = np.where(structure.owners >= 0, structure.owners, structure.n_nets)[alive]
    final = np.bincount(owner * _N_CATS + structure.cats[alive], weights=sizes[alive],
                        minlength=(structure.n_nets + 1) * _N_CATS).reshape(structure.n_nets + 1, _N_CATS)
    return _Peak(peak, tuple(int(x) for x in at_peak), tuple(tuple(int(x) for x in row) for row in final))


def _allocator_events(structure: _Structure, sizes: np.ndarray, steps: int) -> list[tuple[int, int]]:
    """The step's timeline as ``(handle, nbytes)`` allocator events, the step repeated ``steps`` times.

    Persistent storages (the first ``registered`` events) are allocated once; each repetition frees the
    previous repetition's gradients where the trace freed the gradients that existed before it. Storages on
    the host (CPU scalars of a meta trace) are left out.
    """
    n = len(sizes)
    size_list = np.where(structure.host, 0, sizes).tolist()
    ev = structure.events.tolist()
    reg = structure.registered
    out = [(e, size_list[e]) for e in ev[:reg]]
    handle = list(range(n))
    # Registered records the step frees (the previous step's grads) -> the record replacing them.
    new_grad = dict(structure.new_grad)
    successor = [(prev, new_grad[i]) for i, prev in structure.prev_grad if i in new_grad]
    step_events = ev[reg:]
    append = out.append
    for step in range(steps):
        base = step * n
        for e in step_events:
            if e >= 0:
                h = base + e
                handle[e] = h
                append((h, size_list[e]))
            else:
                append((handle[~e], -1))
        for prev, new in successor:
            handle[prev] = handle[new]
    return out


# ----------------------------------------------------------------------------------------------------------
# Cached models of a trace over batch sizes
# ----------------------------------------------------------------------------------------------------------
class _Entry:
    """What the cache keeps per architecture and spec: a linear fit over batch size, or exact traces."""

    def __init__(self, structure: _Structure | None, intercept: np.ndarray | None, slope: np.ndarray | None,
                 session_args: tuple) -> None:
        self.structure = structure
        self.intercept = intercept
        self.slope = slope
        self.linear = structure is not None
        self.exact: OrderedDict[int, _Trace] = OrderedDict()
        self.session_args = session_args     # (model, spec) to trace exact batch sizes; () when linear
        self.lock = threading.Lock()

    def sizes_at(self, batch_size: int) -> tuple[_Structure, np.ndarray]:
        if self.linear:
            return self.structure, self.intercept + self.slope * batch_size  # type: ignore[operator,return-value]
        with self.lock:
            hit = self.exact.get(batch_size)
            if hit is not None:
                self.exact.move_to_end(batch_size)
        if hit is None:
            model, spec = self.session_args
            hit = _guarded_trace(lambda: _Session(model, spec).trace(batch_size))
            with self.lock:
                self.exact[batch_size] = hit
                while len(self.exact) > _EXACT_PER_ENTRY:
                    self.exact.popitem(last=False)
        return hit.structure, hit.sizes


_CACHE: OrderedDict[Any, _Entry] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _guarded_trace(run: Callable[[], _Trace]) -> _Trace:
    try:
        return run()
    except EstimateError:
        raise
    except Exception as e:  # the user's model failed on meta: say so, keep the cause
        raise EstimateError(f"tracing the network's step on the meta device failed: {type(e).__name__}: {e}") from e


def _fit(model: Any, spec: _Spec) -> _Entry:
    """Trace at two small batch sizes, fit bytes = intercept + slope * batch per storage, check at a third."""
    def run() -> tuple[_Trace, ...]:
        session = _Session(model, spec)
        return tuple(session.trace(b) for b in (*_FIT_BATCHES, _CHECK_BATCH))

    try:
        t1, t2, t3 = run()
    except EstimateError:
        raise
    except Exception:  # e.g. a model that needs a larger batch: trace exact sizes only
        return _Entry(None, None, None, (model, spec))
    b1, b2 = _FIT_BATCHES
    if t1.structure.same_as(t2.structure) and t1.structure.same_as(t3.structure):
        diff = t2.sizes - t1.sizes
        if not np.any(diff % (b2 - b1)):
            slope = diff // (b2 - b1)
            intercept = t1.sizes - slope * b1
            if np.all(intercept >= 0) and np.array_equal(intercept + slope * _CHECK_BATCH, t3.sizes):
                return _Entry(t1.structure, intercept, slope, ())
    entry = _Entry(None, None, None, (model, spec))
    for t in (t1, t2, t3):
        entry.exact[t.batch_size] = t
    return entry


def _entry(model: Any, spec: _Spec, cache_key: Any) -> _Entry:
    if cache_key is not None:
        try:
            hash(cache_key)
        except TypeError:
            raise EstimateError(f"cache_key must be hashable, but got {type(cache_key).__name__}.") from None
        key = ("user", cache_key, spec)
    else:
        key = (_guarded_key(model, spec), spec)
    with _CACHE_LOCK:
        entry = _CACHE.get(key)
        if entry is not None:
            _CACHE.move_to_end(key)
            return entry
    entry = _fit(model, spec)      # outside the lock: other threads' evaluations go on meanwhile
    with _CACHE_LOCK:
        entry = _CACHE.setdefault(key, entry)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return entry


def _guarded_key(model: Any, spec: _Spec) -> tuple:
    try:
        return _arch_key(model, spec)
    except EstimateError:
        raise
    except Exception as e:
        raise EstimateError(f"building the network on the meta device failed: {type(e).__name__}: {e}") from e


def clear_cache() -> None:
    """Forget every cached trace and workspace coefficient (tests and benchmarks use it)."""
    with _CACHE_LOCK:
        _CACHE.clear()
        _COEF_CACHE.clear()


# ----------------------------------------------------------------------------------------------------------
# Host heap: what glibc's malloc keeps resident beyond the live bytes (CPU targets)
# ----------------------------------------------------------------------------------------------------------
# torch's CPU allocator is glibc malloc (c10 alloc_cpu: posix_memalign). Rules of glibc's malloc.c / mallopt(3):
# a request of at least the mmap threshold gets its own mapping, returned to the OS at free; a smaller one is
# carved from the heap, whose freed chunks stay resident. The threshold starts at 128 KiB and is dynamic:
# freeing a mapped chunk larger than it (up to 32 MiB on 64-bit) raises it to that chunk's size. So after
# the first step, every transient storage smaller than the largest freed one lives on the heap.
_MMAP_THRESHOLD = 128 * 1024            # DEFAULT_MMAP_THRESHOLD_MIN
_MMAP_THRESHOLD_MAX = 32 * 1024 ** 2    # DEFAULT_MMAP_THRESHOLD_MAX (64-bit)
_CHUNK_OVERHEAD = 16                    # chunk header (SIZE_SZ) and 16-byte alignment
_PAGE = 4096
# Steps replayed: the first raises the threshold, the next ones run on the heap as a long training does.
_HEAP_STEPS = 3
# What the heap keeps resident above the step's live bytes, as a multiple of the high-water of live heap
# storages (those below the threshold). Measured on this kind of host (glibc 2.36, torch 2.13, 1-2 threads):
# VmHWM of real CPU training (MLPs, CNNs, NatureCNN, batch 32-4096, 20-300 steps) minus the traced tensor and
# kernel-workspace peak is 0.3x to 2.5x that high-water, median about 1x, and varies by +-30% between
# identical runs (small allocations split freed chunks, so a same-size request cannot reuse them). The
# median is the estimate; the spread is left to the learned margin. With a fixed threshold
# (``MALLOC_MMAP_THRESHOLD_`` set) nothing large is retained and the traced peak is what the process keeps.
_HEAP_RETENTION = 1.0


def _mmap_threshold() -> tuple[int, bool]:
    """(initial threshold, dynamic) as the trial's glibc will have them, read from this process's environment.

    ``MALLOC_MMAP_THRESHOLD_`` or the tunable ``glibc.malloc.mmap_threshold`` fix the threshold (mallopt(3)).
    """
    fixed = os.environ.get("MALLOC_MMAP_THRESHOLD_", "")
    for tunable in os.environ.get("GLIBC_TUNABLES", "").split(":"):
        name, _, value = tunable.partition("=")
        if name == "glibc.malloc.mmap_threshold":
            fixed = value
    if fixed.isdigit():
        return int(fixed), False
    return _MMAP_THRESHOLD, True


def _heap_high_water(structure: _Structure, sizes: np.ndarray) -> int:
    """High-water of live heap bytes (storages below glibc's mmap threshold) over ``_HEAP_STEPS`` steps."""
    threshold, dynamic = _mmap_threshold()
    heap = high = 0
    live: dict[int, tuple[int, bool]] = {}
    for handle, nbytes in _allocator_events(structure, sizes, _HEAP_STEPS):
        if nbytes > 0:
            chunk = nbytes + _CHUNK_OVERHEAD
            mapped = chunk >= threshold
            live[handle] = (chunk, mapped)
            if not mapped:
                heap += chunk
                high = max(high, heap)
        elif nbytes < 0 and handle in live:
            chunk, mapped = live.pop(handle)
            if not mapped:
                heap -= chunk
            elif dynamic:
                pages = -(-chunk // _PAGE) * _PAGE
                if threshold < pages <= _MMAP_THRESHOLD_MAX:
                    threshold = pages
    return high


# ----------------------------------------------------------------------------------------------------------
# Footprint assembly
# ----------------------------------------------------------------------------------------------------------
_COEF_CACHE: dict[str, np.ndarray] = {}


def _workspace_coefficients(calibration: Any) -> np.ndarray:
    """This host's coefficient per rule of ``WORKSPACE_RULES`` (kept per cache directory once read)."""
    if calibration is None:
        from .. import calibration as _cal

        key = str(_cal.cache_dir())
        coef = _COEF_CACHE.get(key)
        if coef is None:
            coef = _COEF_CACHE[key] = _workspace_coefficients(_cal.load())
        return coef
    kernels = calibration.cpu_kernels()
    return np.array([kernels.coefficient(rule) for rule in WORKSPACE_RULES], dtype=np.float64)


def _scale_workspaces(structure: _Structure, sizes: np.ndarray, calibration: Any = None) -> np.ndarray:
    """Sizes with each kernel workspace record's feature bytes turned into bytes by this host's coefficients."""
    ws = structure.rules >= 0
    if not ws.any():
        return sizes
    coef = _workspace_coefficients(calibration)
    scaled = np.rint(sizes * coef[np.where(ws, structure.rules, 0)]).astype(np.int64)
    return np.where(ws, scaled, sizes)


def _footprint(model: Any, spec: _Spec, batch_size: int, *, cache_key: Any, name: str,
               calibration: Any = None) -> Footprint:
    if not isinstance(name, str):
        raise EstimateError(f"name must be a str, but got {name!r}.")
    entry = _entry(model, spec, cache_key)
    structure, sizes = entry.sizes_at(batch_size)
    if spec.cuda:
        rounded = -(-sizes // _alloc.MIN_BLOCK_SIZE) * _alloc.MIN_BLOCK_SIZE
        result = _analyse(structure, np.where(sizes > 0, np.maximum(rounded, _alloc.MIN_BLOCK_SIZE), 0),
                          device_only=True)
    else:
        sizes = _scale_workspaces(structure, sizes, calibration)
        result = _analyse(structure, sizes)
    where = "vram" if spec.cuda else "ram"
    note = f"batch {batch_size}"
    if spec.accumulation_steps > 1:
        note += f" x {spec.accumulation_steps} micro-steps"
    comps = []
    for label, cat, nbytes in _split(result, spec, name):
        if nbytes or cat in (_W, _A):
            comps.append(Component(f"{label} {_CAT_NAMES[cat]}", _CAT_KINDS[cat], **{where: nbytes},
                                   note=note if cat in (_A, _T) else _KERNEL_NOTE if cat == _K else ""))
    if not spec.cuda:
        retained = int(_HEAP_RETENTION * _heap_high_water(structure, sizes))
        if retained:
            comps.append(Component(f"{name} allocator overhead", Kind.ALLOCATOR, ram=retained,
                                   note="glibc heap retention (model; varies run to run)"))
    if spec.cuda:
        workspace = _alloc.CUBLAS_WORKSPACE_BYTES
        peaks = _alloc.replay([(-1, workspace)] + _allocator_events(structure, sizes, _ALLOCATOR_STEPS))
        overhead = max(0, peaks.peak_reserved - result.peak - workspace)
        comps += [
            Component(f"{name} allocator overhead", Kind.ALLOCATOR, vram=overhead,
                      note="reserved - allocated (caching allocator model)"),
            Component("cuBLAS workspace", Kind.CUDA_CONTEXT, vram=workspace, note="one handle, one stream"),
            Component("CUDA context", Kind.CUDA_CONTEXT, vram=_alloc.CUDA_CONTEXT_BYTES,
                      note="default; calibrate on a GPU host"),
        ]
    return Footprint(tuple(comps))


def _split(result: _Peak, spec: _Spec, name: str) -> list[tuple[str, int, int]]:
    """(label, category, bytes) parts adding up to the peak: persistent state whole, the rest above it.

    Weights, frozen weights, gradients and optimizer state are given per network (labelled ``name net``
    for a dict model); activations and temporaries, the part of the peak above them, for the whole step.
    """
    persistent = (_W, _FW, _G, _O) if spec.training else (_W, _FW)
    labels = [name] if spec.nets == ("",) else [f"{name} {net}" for net in spec.nets]
    parts = []
    for cat in persistent:
        for label, row in zip(labels, result.final):
            parts.append((label, cat, row[cat]))
        if result.final[-1][cat]:  # persistent storages of no network (rare: state a step created)
            parts.append((name, cat, result.final[-1][cat]))
    above = max(0, result.peak - sum(result.persistent(cat) for cat in persistent))
    kernel = min(result.at_peak[_K], above)
    tail = [(name, _K, kernel)] if kernel else []
    above -= kernel
    if not spec.training:
        return parts + [(name, _A, above)] + tail
    act = min(result.at_peak[_A], above)
    return parts + [(name, _A, act), (name, _T, above - act)] + tail
