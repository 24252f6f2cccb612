"""The public functions ``torch_training`` and ``torch_inference``: spec -> cached trace -> Footprint.

Owns the footprint assembly (components per category, CPU kernel-workspace coefficients, the host heap and
CUDA allocator overheads); knows nothing of how a step is traced or cached, nor of the allocators' rules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from ...exceptions import CalibrationError, EstimateError
from .. import allocator, heap
from ..baselines import CudaCosts
from ..footprint import Component, Footprint, Kind
from . import cache
from .analysis import allocator_events, analyse
from .dispatch import Category
from .spec import make_spec
from .workspaces import WORKSPACE_RULES

if TYPE_CHECKING:
    from .analysis import Peak, Structure
    from .spec import Spec

__all__ = ["torch_training", "torch_inference", "clear_cache", "scale_workspaces"]

# Replays of the step through the allocator model: the second one reuses the first one's cached blocks,
# as every step after the first does on a real GPU.
_ALLOCATOR_STEPS = 2
_KERNEL_NOTE = "oneDNN buffers outside the dispatcher, calibrated on this host"
_COEF_CACHE: dict[str, np.ndarray] = {}
_CUDA_CACHE: dict[str, CudaCosts] = {}
_logger = logging.getLogger(__name__)
T = TypeVar("T")


def torch_training(
    model: Any,
    input_shape: Any,
    *,
    batch_size: int,
    input_dtype: str = "float32",
    optimizer: Any = "adam",
    dtype: str = "float32",
    autocast: str | None = None,
    accumulation_steps: int = 1,
    frozen: int | Mapping[str, int] = 0,
    device: str = "cpu",
    cache_key: Any = None,
    name: str = "network",
    calibration: Any = None,
    scheduler: Any = None,
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
        optimizer: any ``torch.optim`` optimizer by class name, case-insensitive (``"adam"``, ``"Adagrad"``,
            ``"nadam"``...; a name means lr 1e-3 and torch's defaults, except ``"sgd"``: momentum 0.9 unless
            given), an ``Optimizer`` subclass (a library's own too) or instance (its class and the kwargs it
            was built with), a pair ``(name or class, kwargs)`` such as ``("sgd", {"momentum": 0})``, or
            ``None`` for no optimizer. ``LBFGS`` and ``SparseAdam`` are refused with the reason (see
            ``torchnet.optimizers``).
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
            (``device="cpu"``) and whose CUDA context and cuBLAS workspaces, measured where a GPU is visible,
            complete a ``device="cuda"`` footprint (elsewhere: 300 MiB and 8.1 MiB, the component's note
            says so); by default this environment's (``calibration.load()``, measured on first use, seconds).
        scheduler: a ``torch.optim.lr_scheduler`` class, by name or class, or a pair ``(name or class,
            kwargs)`` such as ``("StepLR", {"step_size": 7})``, stepped after each optimizer step; ``None`` for
            none. Schedulers change no tensor memory; this checks that the step still traces with one.

    Returns:
        A Footprint with components ``<name> weights``, ``frozen weights`` (if any), ``gradients``,
        ``optimizer state`` (if any), ``activations`` and ``temporaries``: weights, gradients and state
        are their full sizes; activations (storages allocated in the forward and still alive when backward
        starts, i.e. saved for backward, plus the batch) and temporaries share the rest of the peak. They
        add up to the step's peak of live tensor bytes. For ``device="cpu"`` two host components follow:
        ``kernel workspaces`` (buffers oneDNN convolutions allocate inside the op, outside the dispatcher,
        alive at the peak; sized by coefficients calibrated on this host) and ``allocator overhead`` (what
        glibc's heap keeps resident above the live bytes; a model, see ``estimate.heap``). Tensors,
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
          ``FakeTensorMode`` CPU tensors (meta storage, CPU's kernel choices); see ``tracing.Session``.
          GPU targets are traced on meta, so CUDA-only kernels are not reproduced: attention runs the math
          path (a (B, heads, L, L) matrix, more than flash attention keeps) and LSTMs the cell-by-cell path
          (not cuDNN's).
        - Memory a kernel allocates without dispatching is invisible to the trace. For CPU targets the
          convolutions' oneDNN buffers are added by rule (see ``WORKSPACE_RULES``; torch's default oneDNN
          backend assumed, ``torch.backends.mkldnn.enabled``); still missing: cuDNN's convolution workspaces
          on GPUs (the cuBLAS workspaces and the CUDA context are measured on a host with a GPU), oneDNN's
          LSTM workspace on CPU (its meta kernel says 0 bytes), and the one-off oneDNN primitives of each new
          conv shape (0.1-2 MiB each).
        - The allocator overhead of CPU targets assumes glibc's malloc with its default dynamic mmap
          threshold (or ``MALLOC_MMAP_THRESHOLD_`` as set in this process's environment); a preloaded jemalloc
          or tcmalloc behaves otherwise. Under the default, peak RSS of identical runs differs by up to
          +-30% and creeps up over the first hundreds of steps.
        - The loss is the mean of the outputs, not the user's loss; tensors a module keeps outside its
          parameters and buffers are copied, not re-created on meta.
        - The first trace in a process pays torch's one-off warm-up (its Python meta kernels import
          ``torch._dynamo``, 1-2 s on a small machine).

    Examples:
        >>> import torch.nn as nn
        >>> fp = torch_training(lambda: nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2)),
        ...                     (8,), batch_size=32)
        >>> fp.ram > 0
        True
    """
    spec = make_spec(
        model,
        input_shape,
        training=True,
        batch_size=batch_size,
        input_dtype=input_dtype,
        optimizer=optimizer,
        dtype=dtype,
        autocast=autocast,
        accumulation_steps=accumulation_steps,
        frozen=frozen,
        device=device,
        scheduler=scheduler,
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

    Arguments as for ``torch_training``. The components are ``<name> weights`` and ``<name>
    activations`` (everything above the weights at the peak: under ``no_grad`` nothing is kept for backward,
    so it is all transient), and for ``device="cpu"`` the host's ``kernel workspaces`` and ``allocator
    overhead`` where they are not zero.

    Examples:
        >>> import torch.nn as nn
        >>> torch_inference(lambda: nn.Linear(8, 2), (8,), batch_size=1).components[0].name
        'network weights'
    """
    spec = make_spec(
        model,
        input_shape,
        training=False,
        batch_size=batch_size,
        input_dtype=input_dtype,
        optimizer=None,
        dtype=dtype,
        autocast=autocast,
        accumulation_steps=1,
        frozen=0,
        device=device,
    )
    return _footprint(model, spec, batch_size, cache_key=cache_key, name=name, calibration=calibration)


def _this_hosts(memo: dict[str, T], read: Callable[[Any], T]) -> T:
    """``read(calibration.load())``, kept per cache directory once read."""
    from .. import calibration as _cal

    key = str(_cal.cache_dir())
    if key not in memo:
        memo[key] = read(_cal.load())
    return memo[key]


def _cuda_costs(calibration: Any) -> CudaCosts:
    """This host's CUDA context and cuBLAS workspace: measured once where a GPU is visible (cached), else the
    defaults."""
    if calibration is None:
        return _this_hosts(_CUDA_CACHE, _cuda_costs)
    try:
        costs = calibration.cuda_costs(measure=_gpu_visible())
    except CalibrationError as e:
        _logger.warning("The CUDA context could not be measured (%s): using the defaults.", e)
        costs = None
    return costs or CudaCosts.default()


def _gpu_visible() -> bool:
    """A CUDA GPU is visible here. ``device_count()`` asks NVML first, which leaves the CUDA driver of this
    process (one that forks trials) uninitialised; ``is_available()`` would not."""
    try:
        return torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001 - a broken driver: no GPU to measure, the defaults
        return False


def _workspace_coefficients(calibration: Any) -> np.ndarray:
    """This host's coefficient per rule of ``WORKSPACE_RULES``."""
    if calibration is None:
        return _this_hosts(_COEF_CACHE, _workspace_coefficients)
    kernels = calibration.cpu_kernels()
    return np.array([kernels.coefficient(rule) for rule in WORKSPACE_RULES], dtype=np.float64)


def scale_workspaces(structure: Structure, sizes: np.ndarray, calibration: Any = None) -> np.ndarray:
    """Sizes with each kernel workspace record's feature bytes turned into bytes by this host's coefficients."""
    ws = structure.rules >= 0
    if not ws.any():
        return sizes
    coef = _workspace_coefficients(calibration)
    scaled = np.rint(sizes * coef[np.where(ws, structure.rules, 0)]).astype(np.int64)
    return np.where(ws, scaled, sizes)


def _footprint(
    model: Any, spec: Spec, batch_size: int, *, cache_key: Any, name: str, calibration: Any = None
) -> Footprint:
    if not isinstance(name, str):
        raise EstimateError(f"name must be a str, but got {name!r}.")
    entry = cache.lookup(model, spec, cache_key)
    structure, sizes = entry.sizes_at(batch_size)
    if spec.cuda:
        rounded = -(-sizes // allocator.MIN_BLOCK_SIZE) * allocator.MIN_BLOCK_SIZE
        result = analyse(
            structure, np.where(sizes > 0, np.maximum(rounded, allocator.MIN_BLOCK_SIZE), 0), device_only=True
        )
    else:
        sizes = scale_workspaces(structure, sizes, calibration)
        result = analyse(structure, sizes)
    where = "vram" if spec.cuda else "ram"
    note = f"batch {batch_size}"
    if spec.accumulation_steps > 1:
        note += f" x {spec.accumulation_steps} micro-steps"
    comps = []
    notes = {Category.ACTIVATIONS: note, Category.TEMPORARIES: note, Category.KERNEL_WORKSPACES: _KERNEL_NOTE}
    for label, cat, nbytes in _split(result, spec, name):
        if nbytes or cat in (Category.WEIGHTS, Category.ACTIVATIONS):
            comps.append(Component(f"{label} {cat.label}", cat.kind, **{where: nbytes}, note=notes.get(cat, "")))
    if not spec.cuda:
        retained = heap.retained(allocator_events(structure, sizes, heap.STEPS))
        if retained:
            comps.append(
                Component(
                    f"{name} allocator overhead",
                    Kind.ALLOCATOR,
                    ram=retained,
                    note="glibc heap retention (model; varies run to run)",
                )
            )
    if spec.cuda:
        costs = _cuda_costs(calibration)
        workspace = costs.cublas_workspace
        peaks = allocator.replay([(-1, workspace)] + allocator_events(structure, sizes, _ALLOCATOR_STEPS))
        overhead = max(0, peaks.peak_reserved - result.peak - workspace)
        comps += [
            Component(
                f"{name} allocator overhead",
                Kind.ALLOCATOR,
                vram=overhead,
                note="reserved - allocated (caching allocator model)",
            ),
            Component("cuBLAS workspace", Kind.CUDA_CONTEXT, vram=workspace, note="one handle, one stream"),
            Component(
                "CUDA context",
                Kind.CUDA_CONTEXT,
                vram=costs.context,
                note=f"measured on this host's {costs.gpu}"
                if costs.measured
                else "default: measured on the first host with a GPU that evaluates it",
            ),
        ]
    return Footprint(tuple(comps))


def _split(result: Peak, spec: Spec, name: str) -> list[tuple[str, Category, int]]:
    """(label, category, bytes) parts adding up to the peak: persistent state whole, the rest above it.

    Weights, frozen weights, gradients and optimizer state are given per network (labelled ``name net``
    for a dict model); activations and temporaries, the part of the peak above them, for the whole step.
    """
    persistent: tuple[Category, ...] = (Category.WEIGHTS, Category.FROZEN_WEIGHTS)
    if spec.training:
        persistent += (Category.GRADIENTS, Category.OPTIMIZER_STATE)
    labels = [name] if spec.nets == ("",) else [f"{name} {net}" for net in spec.nets]
    parts = []
    for cat in persistent:
        for label, row in zip(labels, result.final, strict=False):
            parts.append((label, cat, row[cat]))
        if result.final[-1][cat]:  # persistent storages of no network (rare: state a step created)
            parts.append((name, cat, result.final[-1][cat]))
    above = max(0, result.peak - sum(result.persistent(cat) for cat in persistent))
    kernel = min(result.at_peak[Category.KERNEL_WORKSPACES], above)
    tail = [(name, Category.KERNEL_WORKSPACES, kernel)] if kernel else []
    above -= kernel
    if not spec.training:
        return parts + [(name, Category.ACTIVATIONS, above)] + tail
    act = min(result.at_peak[Category.ACTIVATIONS], above)
    return parts + [(name, Category.ACTIVATIONS, act), (name, Category.TEMPORARIES, above - act)] + tail


def clear_cache() -> None:
    """Forget every cached trace and workspace coefficient (tests and benchmarks use it)."""
    cache.clear()
    _COEF_CACHE.clear()
