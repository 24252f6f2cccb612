"""Tests of estimate/torchnet's coverage: every torch.optim optimizer, LR schedulers, data-reading constructors.

Each traced step on meta is checked against the same step on real CPU tensors under the same counter (the
pattern of test_torchnet.py): same storages, so the same peak.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from optuna_memprune.estimate import torch_training, torchnet  # noqa: E402
from optuna_memprune.estimate.torchnet import construct  # noqa: E402
from optuna_memprune.exceptions import EstimateError  # noqa: E402

UNTRACEABLE = {"LBFGS", "SparseAdam"}
ALL_OPTIMIZERS = sorted(
    n
    for n in dir(torch.optim)
    if isinstance(getattr(torch.optim, n), type)
    and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
    and n not in ("Optimizer", *UNTRACEABLE)
)


@pytest.fixture(autouse=True)
def _fresh_cache():
    torchnet.clear_cache()
    yield
    torchnet.clear_cache()


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def mlp_2d_params():
    """Muon takes matrices only."""
    return nn.Sequential(nn.Linear(16, 32, bias=False), nn.ReLU(), nn.Linear(32, 4, bias=False))


def _same_as_real_cpu(factory, shape, **kwargs):
    meta = torchnet.trace(factory, shape, **kwargs)
    real = torchnet.trace(factory, shape, device="cpu", **kwargs)
    assert meta.device == "meta" and real.device == "cpu"
    assert real.peak > 0
    assert meta.peak == real.peak, (meta.peak, real.peak)
    return meta


def test_every_torch_optimizer_is_known():
    # the list the tests run over is torch's own: a new optimizer in torch is tested (or refused) here
    assert {"Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop", "Adam", "SGD"} <= set(ALL_OPTIMIZERS)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("name", ALL_OPTIMIZERS)
def test_every_optimizer_by_name_traces_as_on_real_cpu(name, target):
    factory = mlp_2d_params if name == "Muon" else mlp
    with_state = _same_as_real_cpu(factory, (16,), batch_size=8, optimizer=name.lower(), target=target)
    without = torchnet.trace(factory, (16,), batch_size=8, optimizer=None, target=target)
    assert with_state.peak >= without.peak


@pytest.mark.parametrize("form", ["class", "pair", "instance"])
@pytest.mark.parametrize("name", ["Adagrad", "ASGD", "AdamW"])
def test_optimizer_as_class_pair_or_instance_with_kwargs(name, form):
    cls = getattr(torch.optim, name)
    kwargs = {"lr": 0.01, "weight_decay": 1e-4}
    if form == "class":
        optimizer = cls
    elif form == "pair":
        optimizer = (cls, kwargs)
    else:
        optimizer = cls(mlp().parameters(), **kwargs)  # a user's instance: its class and kwargs are read
    _same_as_real_cpu(mlp, (16,), batch_size=8, optimizer=optimizer, target="cuda")
    fp = torch_training(mlp, (16,), batch_size=8, optimizer=optimizer, device="cuda")
    assert any(c.name == "network optimizer state" and c.vram > 0 for c in fp.components)


def test_foreach_follows_the_target_device_and_changes_the_step_peak():
    # Adagrad's foreach step keeps a list of intermediates alive: the CUDA target (foreach) peaks higher
    cpu = _same_as_real_cpu(mlp, (16,), batch_size=8, optimizer="adagrad", target="cpu")
    cuda = _same_as_real_cpu(mlp, (16,), batch_size=8, optimizer="adagrad", target="cuda")
    loop = _same_as_real_cpu(mlp, (16,), batch_size=8, optimizer=("adagrad", {"foreach": False}), target="cuda")
    assert cuda.peak > cpu.peak and loop.peak == cpu.peak


def test_fused_optimizer_traces_as_the_single_tensor_loop():
    fused = torchnet.trace(mlp, (16,), batch_size=8, optimizer=("adam", {"fused": True}), target="cuda")
    loop = torchnet.trace(mlp, (16,), batch_size=8, optimizer=("adam", {"foreach": False}), target="cuda")
    assert fused.peak == loop.peak


@pytest.mark.parametrize(
    "scheduler",
    [
        "StepLR",
        ("StepLR", {"step_size": 7, "gamma": 0.1}),
        ("OneCycleLR", {"max_lr": 0.1, "total_steps": 100}),
        ("CosineAnnealingLR", {"T_max": 10}),
        "ReduceLROnPlateau",
    ],
)
def test_lr_schedulers_do_not_break_or_change_the_trace(scheduler):
    if scheduler == "StepLR":
        scheduler = (torch.optim.lr_scheduler.StepLR, {"step_size": 1})
    plain = torchnet.trace(mlp, (16,), batch_size=8, optimizer="adam", target="cuda")
    with_sched = _same_as_real_cpu(mlp, (16,), batch_size=8, optimizer="adam", target="cuda", scheduler=scheduler)
    assert with_sched.peak == plain.peak
    fp = torch_training(mlp, (16,), batch_size=8, optimizer="adam", device="cuda", scheduler=scheduler)
    assert fp.vram > 0


@pytest.mark.parametrize(
    "optimizer, fragment",
    [
        ("lbfgs", "optimizer LBFGS cannot be traced on the meta device: its step() re-runs the closure"),
        ("SparseAdam", "optimizer SparseAdam cannot be traced on the meta device: it takes sparse gradients"),
        ("adagrad_typo", "optimizer must be a torch.optim optimizer ('Adadelta', 'Adafactor', 'Adagrad'"),
        (nn.Linear, "optimizer must be a torch.optim optimizer"),
        (("adagrad", {"no_such_kwarg": 1}), "optimizer 'adagrad' rejected its kwargs"),
    ],
)
def test_untraceable_or_unknown_optimizers_are_refused_with_the_reason(optimizer, fragment):
    with pytest.raises(EstimateError) as info:
        torch_training(mlp, (16,), batch_size=8, optimizer=optimizer)
    assert fragment in str(info.value)


def test_bad_scheduler_is_refused():
    with pytest.raises(EstimateError, match="scheduler must be a torch.optim.lr_scheduler class"):
        torch_training(mlp, (16,), batch_size=8, scheduler="NoSuchLR")
    with pytest.raises(EstimateError, match="scheduler 'StepLR' rejected its kwargs"):
        torch_training(mlp, (16,), batch_size=8, scheduler=("StepLR", {"nope": 1}))


# --------------------------------------------------------------------------------------------------------
# Constructors that read tensor data
# --------------------------------------------------------------------------------------------------------
class WidthFromData(nn.Module):
    """Computes its widths with tensors and reads them back (``.tolist()``, ``.item()``), as RegNet does."""

    def __init__(self) -> None:
        super().__init__()
        widths = (torch.round(torch.tensor([1.0, 2.5]) * 12) // 4 * 4).int().tolist()
        hidden = int(torch.tensor(widths).sum().item())
        self.register_buffer("scale", torch.ones(hidden))
        self.net = nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, 4))

    def forward(self, x):
        return self.net[2](self.net[1](self.net[0](x) * self.scale))


class ReadsItsOwnWeights(nn.Module):
    """Reads a parameter's value in its constructor: cannot be built without memory."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)
        self.sign = 1 if self.fc.weight.sum().item() >= 0 else -1

    def forward(self, x):
        return self.fc(x) * self.sign


def test_constructor_reading_tensor_data_is_built_on_cpu_with_meta_weights():
    with pytest.raises(NotImplementedError):  # on meta alone it fails
        with torch.device("meta"):
            WidthFromData()
    meta = _same_as_real_cpu(WidthFromData, (16,), batch_size=8, optimizer="adagrad", target="cuda")
    assert meta.peak > 0
    fp = torch_training(WidthFromData, (16,), batch_size=8, optimizer="adagrad")
    weights = next(c.ram for c in fp.components if c.name == "network weights")
    real = WidthFromData()
    assert weights == sum(t.numel() * 4 for t in [*real.parameters(), *real.buffers()])


def test_constructor_that_cannot_be_built_without_memory_gets_a_clear_error():
    with pytest.raises(EstimateError) as info:
        torch_training(ReadsItsOwnWeights, (16,), batch_size=8)
    text = str(info.value)
    assert "could not be built without memory: on the meta device it failed" in text
    assert "Pass an nn.Module instance built as usual instead" in text
    fp = torch_training(ReadsItsOwnWeights(), (16,), batch_size=8)  # what the error says to pass works
    assert fp.ram > 0


def test_other_threads_building_modules_meanwhile_keep_real_weights():
    import threading

    seen = {}

    def factory():
        model = WidthFromData()  # inside the CPU build with weights moved to meta
        worker = threading.Thread(target=lambda: seen.update(other=nn.Linear(2, 2)))
        worker.start()
        worker.join()
        return model

    module = construct.call_factory(factory, "model")
    assert all(p.device.type == "meta" for p in module.parameters())
    assert seen["other"].weight.device.type == "cpu" and seen["other"].weight.abs().sum() > 0


def test_constructor_holding_large_cpu_tensors_is_stopped(monkeypatch):
    monkeypatch.setattr(construct, "CPU_LIMIT_BYTES", 64)
    with pytest.raises(EstimateError, match="holds more than 64 bytes of CPU tensors at once"):
        torch_training(WidthFromData, (16,), batch_size=8)


@pytest.fixture(scope="module")
def tvm():
    """``torchvision.models``. A torchvision wheel built for another torch build than the installed one (a
    CUDA wheel beside the CPU torch) fails to load its compiled detection ops in ``_meta_registrations``,
    which classification models do not use: that one module is stubbed before the first import. Skips
    only when torchvision is not installed."""
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed")
    name = "torchvision._meta_registrations"
    if "torchvision" not in sys.modules and name not in sys.modules:
        sys.modules[name] = types.ModuleType(name)
    import torchvision.models

    return torchvision.models


def test_torchvision_regnet_traces_as_on_real_cpu(tvm):
    factory = lambda: tvm.regnet_y_400mf(num_classes=10)  # noqa: E731   (RegNetY: squeeze-excitation too)
    _same_as_real_cpu(factory, (3, 16, 16), batch_size=2, optimizer="adagrad", target="cuda")
    fp = torch_training(factory, (3, 16, 16), batch_size=2, optimizer="adagrad")
    n_params = sum(p.numel() for p in factory().parameters())
    assert next(c.ram for c in fp.components if c.name == "network gradients") == n_params * 4
