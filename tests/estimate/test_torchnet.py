"""Tests of estimate/torchnet: the meta trace against the same step on real CPU tensors, and the API."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from optuna_memprune.estimate import Footprint, Kind, torch_inference, torch_training  # noqa: E402
from optuna_memprune import estimate as omp_estimate  # noqa: E402
from optuna_memprune.estimate import allocator, torchnet  # noqa: E402
from optuna_memprune.exceptions import EstimateError  # noqa: E402


# --------------------------------------------------------------------------------------------------------
# Architectures (small widths so the real-CPU runs stay fast)
# --------------------------------------------------------------------------------------------------------
class Dueling(nn.Module):
    def __init__(self, n_in: int = 16, hidden: int = 32, n_actions: int = 4) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU())
        self.value = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.advantage = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_actions))

    def forward(self, x):
        h = self.features(x)
        a = self.advantage(h)
        return self.value(h) + a - a.mean(dim=1, keepdim=True)


class LSTMNet(nn.Module):
    def __init__(self, n_in: int = 8, hidden: int = 32, n_out: int = 4) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_in, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 16)
        self.b = nn.Linear(3, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, x, y):
        return self.out(torch.relu(self.a(x) + self.b(y)))


def mlp(width: int = 64):
    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 4))


def nature_dqn():
    gym = pytest.importorskip("gymnasium")
    torch_layers = pytest.importorskip("stable_baselines3.common.torch_layers")
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    return nn.Sequential(torch_layers.NatureCNN(space, features_dim=512), nn.Linear(512, 6))


def transformer():
    return nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)


def bn_cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 7 * 7, 10),
    )


ARCHS = {
    "mlp": (mlp, (16,), "float32"),
    "nature_dqn": (nature_dqn, (4, 84, 84), "uint8"),
    "dueling": (Dueling, (16,), "float32"),
    "lstm": (LSTMNet, (12, 8), "float32"),
    "transformer": (transformer, (10, 32), "float32"),
    "bn_cnn": (bn_cnn, (3, 32, 32), "float32"),
}


@pytest.fixture(autouse=True)
def _fresh_cache():
    torchnet.clear_cache()
    yield
    torchnet.clear_cache()


def _rel(a: int, b: int) -> float:
    return abs(a - b) / b


def _by_name(fp: Footprint) -> dict[str, int]:
    return {c.name: c.ram or c.vram for c in fp.components}


def _traced(fp: Footprint) -> int:
    """A CPU footprint's RAM without glibc's heap retention: the traced tensors and kernel workspaces."""
    return fp.ram - sum(c.ram for c in fp.components if c.kind is Kind.ALLOCATOR)


def _with_workspaces(trace) -> int:
    """The trace's peak with its kernel workspaces sized by this host's coefficients (as a CPU footprint)."""
    return torchnet.analyse(trace.structure, torchnet.scale_workspaces(trace.structure, trace.sizes)).peak


@contextlib.contextmanager
def _no_onednn(arch: str):
    """oneDNN's fused LSTM keeps a private workspace that its meta kernel reports as 0 bytes (a documented
    gap of the trace); the comparison of the counting itself runs both sides on the generic ATen LSTM."""
    if arch != "lstm":
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note about TF32 on Intel GPUs
        with torch.backends.mkldnn.flags(enabled=False):
            yield


# --------------------------------------------------------------------------------------------------------
# Acceptance: meta trace vs the same step on real CPU tensors, same counter
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["train-sgd", "train-adam", "inference"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_meta_trace_peak_within_1pct_of_real_cpu(arch, mode):
    factory, shape, input_dtype = ARCHS[arch]
    training = mode != "inference"
    optimizer = mode.split("-")[1] if training else None
    kwargs = dict(batch_size=8, input_dtype=input_dtype, optimizer=optimizer, training=training)
    with _no_onednn(arch):
        meta = torchnet.trace(factory, shape, **kwargs)
        real = torchnet.trace(factory, shape, device="cpu", **kwargs)
    assert real.peak > 0
    assert _rel(meta.peak, real.peak) <= 0.01, (meta.peak, real.peak)
    assert meta.device in ("meta", "fake") and real.device == "cpu"


@pytest.mark.parametrize("arch", ["mlp", "nature_dqn", "dueling", "bn_cnn"])
def test_meta_trace_matches_real_cpu_for_gpu_target_foreach_adam(arch):
    # device="cuda" traces on plain meta with foreach=True (torch's CUDA default); same kernels on CPU.
    factory, shape, input_dtype = ARCHS[arch]
    kwargs = dict(batch_size=8, input_dtype=input_dtype, optimizer="adam", target="cuda")
    meta = torchnet.trace(factory, shape, **kwargs)
    real = torchnet.trace(factory, shape, device="cpu", **kwargs)
    assert meta.device == "meta"
    assert _rel(meta.peak, real.peak) <= 0.01


def test_meta_and_real_cpu_agree_per_category():
    factory, shape, input_dtype = ARCHS["nature_dqn"]
    meta = torchnet.trace(factory, shape, batch_size=8, input_dtype=input_dtype)
    real = torchnet.trace(factory, shape, batch_size=8, input_dtype=input_dtype, device="cpu")
    a = torchnet.analyse(meta.structure, meta.sizes)
    b = torchnet.analyse(real.structure, real.sizes)
    assert a == b


# --------------------------------------------------------------------------------------------------------
# Footprint contents
# --------------------------------------------------------------------------------------------------------
def test_training_footprint_components_add_up_to_the_traced_peak():
    factory, shape, input_dtype = ARCHS["nature_dqn"]
    fp = torch_training(factory, shape, batch_size=32, input_dtype=input_dtype, optimizer="adam")
    names = _by_name(fp)
    n_params = sum(p.numel() for p in factory().parameters())
    assert names["network weights"] == 4 * n_params
    assert names["network gradients"] == 4 * n_params
    assert names["network optimizer state"] == 8 * n_params + 4 * 10  # exp_avg, exp_avg_sq; 10 step scalars
    # the uint8 batch (32 x 28,224 B) is alive when backward starts: it counts as an activation
    assert names["network activations"] >= 32 * 4 * 84 * 84
    exact = torchnet.trace(factory, shape, batch_size=32, input_dtype=input_dtype)
    assert _traced(fp) == _with_workspaces(exact) > exact.peak and fp.vram == 0  # convolutions: oneDNN buffers
    kinds = {c.kind for c in fp.components}
    assert {Kind.WEIGHTS, Kind.GRADIENTS, Kind.OPTIMIZER, Kind.ACTIVATIONS} <= kinds


def test_inference_footprint_has_weights_and_activations_only():
    fp = torch_inference(lambda: mlp(256), (16,), batch_size=512)
    assert [c.name for c in fp.components if c.kind is not Kind.ALLOCATOR] == ["network weights", "network activations"]
    assert fp.components[1].ram >= 512 * 256 * 4  # one hidden layer's output at least
    assert _traced(fp) == torchnet.trace(lambda: mlp(256), (16,), batch_size=512, training=False).peak


class _MaskChecked(nn.Module):
    """A forward that asks a tensor a question, as Hugging Face models ask whether a padding mask masks."""

    def __init__(self, read: str) -> None:
        super().__init__()
        self.lin, self.read = nn.Linear(16, 16), read

    def forward(self, x):
        mask = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        if self.read == "condition":
            wide = not bool(mask.sum() == mask.numel())  # all valid: the narrow path
        else:
            wide = int(mask.sum().item()) > 4  # a number: what a trace without data cannot know
        out = self.lin(x)
        return torch.cat([out] * 8, dim=1) if wide else out


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_condition_read_from_a_tensor_is_taken_as_holding(device):
    plain = torch_training(lambda: nn.Linear(16, 16), (16,), batch_size=8, device=device)
    checked = torch_training(lambda: _MaskChecked("condition"), (16,), batch_size=8, device=device)
    assert checked.components == plain.components


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_number_read_from_a_tensor_is_refused_saying_what_to_do(device):
    with pytest.raises(EstimateError, match=r"reads a number back from a tensor .*learned"):
        torch_training(lambda: _MaskChecked("number"), (16,), batch_size=8, device=device)


def test_cuda_footprint_takes_the_context_calibrated_on_this_hosts_gpu(tmp_path, monkeypatch):
    from optuna_memprune.estimate import calibration

    monkeypatch.setenv("MEMPRUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    default = torch_training(mlp, (16,), batch_size=8, device="cuda")  # no GPU here: the defaults
    cal = calibration.Calibration(
        tmp_path / "gpu-host.json",
        data={
            "cuda": {
                "LAZY": {
                    "context": 758 * 2**20,
                    "cublas_workspace": 64 * 2**20,
                    "gpu": "NVIDIA H200",
                    "measured_at": 0.0,
                }
            }
        },
    )
    fp = torch_training(mlp, (16,), batch_size=8, device="cuda", calibration=cal)
    got, base = _by_name(fp), _by_name(default)
    assert (got["CUDA context"], got["cuBLAS workspace"]) == (758 * 2**20, 64 * 2**20)
    assert (base["CUDA context"], base["cuBLAS workspace"]) == (
        allocator.CUDA_CONTEXT_BYTES,
        allocator.CUBLAS_WORKSPACE_BYTES,
    )
    assert "NVIDIA H200" in next(c.note for c in fp.components if c.name == "CUDA context")
    # the workspace is replayed through the allocator model: its segment changes the overhead, not the tensors
    assert fp.vram - default.vram > (758 - 300) * 2**20
    assert got["network weights"] == base["network weights"]


def test_sgd_without_momentum_has_no_optimizer_state():
    fp = torch_training(mlp, (16,), batch_size=8, optimizer=("sgd", {"momentum": 0}))
    assert "network optimizer state" not in _by_name(fp)
    fp = torch_training(mlp, (16,), batch_size=8, optimizer="sgd")
    assert _by_name(fp)["network optimizer state"] == _by_name(fp)["network weights"]


def test_cuda_footprint_puts_allocator_figures_in_vram():
    factory, shape, input_dtype = ARCHS["nature_dqn"]
    fp = torch_training(factory, shape, batch_size=64, input_dtype=input_dtype, device="cuda")
    assert fp.ram == 0 and fp.vram > 0
    names = _by_name(fp)
    assert names["CUDA context"] == allocator.CUDA_CONTEXT_BYTES
    assert names["cuBLAS workspace"] == allocator.CUBLAS_WORKSPACE_BYTES
    assert names["network allocator overhead"] >= 0
    tensors = sum(c.vram for c in fp.components if c.kind not in (Kind.CUDA_CONTEXT, Kind.ALLOCATOR))
    # reserved (segments) is a multiple of 2 MiB and at least the tensors plus the workspace
    reserved = fp.vram - allocator.CUDA_CONTEXT_BYTES
    assert reserved % (2 * 2**20) == 0
    assert reserved >= tensors + allocator.CUBLAS_WORKSPACE_BYTES
    # every tensor is rounded to 512 B on the GPU
    assert names["network weights"] % 512 == 0


def test_module_instance_is_copied_to_meta_not_touched():
    net = mlp(32)
    before = [p.detach().clone() for p in net.parameters()]
    fp = torch_training(net, (16,), batch_size=8)
    assert fp.ram == torch_training(lambda: mlp(32), (16,), batch_size=8).ram
    assert all(p.device.type == "cpu" and p.grad is None for p in net.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))


def test_multi_input_model():
    fp = torch_training(TwoInputs, [(6,), (3,)], batch_size=16)
    real = torchnet.trace(TwoInputs, [(6,), (3,)], batch_size=16, device="cpu")
    assert _rel(_traced(fp), real.peak) <= 0.01


# --------------------------------------------------------------------------------------------------------
# Batch scaling, accumulation, frozen copies, dtypes, several networks
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_linear_batch_scaling_equals_exact_trace(batch_size):
    factory, shape, input_dtype = ARCHS["nature_dqn"]
    fp = torch_training(factory, shape, batch_size=batch_size, input_dtype=input_dtype, cache_key="dqn")
    entry = torchnet.cached_entries()[0]
    assert entry.linear
    exact = torchnet.trace(factory, shape, batch_size=batch_size, input_dtype=input_dtype)
    assert _traced(fp) == _with_workspaces(exact)
    # the per-storage linear model reproduces every storage of the exact trace
    structure, sizes = entry.sizes_at(batch_size)
    assert structure.same_as(exact.structure) and np.array_equal(sizes, exact.sizes)


def test_nonlinear_batch_falls_back_to_exact_traces():
    # batch_first=False: the batch dim of (B, 10, 16) is the sequence length, attention is quadratic in it
    def seq_first():
        return nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32)

    fp = torch_training(seq_first, (10, 16), batch_size=48)
    entry = torchnet.cached_entries()[0]
    assert not entry.linear
    assert _traced(fp) == torchnet.trace(seq_first, (10, 16), batch_size=48).peak


def test_accumulation_keeps_state_and_shrinks_activations():
    one_big = _by_name(torch_training(lambda: mlp(128), (16,), batch_size=256))
    four_small = _by_name(torch_training(lambda: mlp(128), (16,), batch_size=64, accumulation_steps=4))
    for part in ("weights", "gradients", "optimizer state"):
        assert one_big[f"network {part}"] == four_small[f"network {part}"]
    assert four_small["network activations"] < 0.5 * one_big["network activations"]
    meta = torchnet.trace(lambda: mlp(32), (16,), batch_size=16, accumulation_steps=3)
    real = torchnet.trace(lambda: mlp(32), (16,), batch_size=16, accumulation_steps=3, device="cpu")
    assert _rel(meta.peak, real.peak) <= 0.01


def test_frozen_copies_add_weights_only():
    factory, shape, input_dtype = ARCHS["nature_dqn"]
    kw = dict(batch_size=32, input_dtype=input_dtype, cache_key="dqn")
    base = _by_name(torch_training(factory, shape, **kw))
    fp1 = torch_training(factory, shape, frozen=1, **kw)
    with_target = _by_name(fp1)
    assert with_target["network frozen weights"] == base["network weights"]
    for part in ("weights", "gradients", "optimizer state"):
        assert with_target[f"network {part}"] == base[f"network {part}"]
    # the target net's own batch (next observations, uint8) and outputs stay alive through the step
    traced_base = sum(v for k, v in base.items() if not k.endswith("allocator overhead"))
    extra = _traced(fp1) - traced_base - base["network weights"]
    assert 0 <= extra <= 32 * 4 * 84 * 84 + 32 * 6 * 4 + 4096
    two = _by_name(torch_training(factory, shape, frozen=2, **kw))
    assert two["network frozen weights"] == 2 * base["network weights"]
    meta = torchnet.trace(factory, shape, batch_size=8, input_dtype=input_dtype, frozen=1)
    real = torchnet.trace(factory, shape, batch_size=8, input_dtype=input_dtype, frozen=1, device="cpu")
    assert _rel(meta.peak, real.peak) <= 0.01


def test_bfloat16_params_halve_weights_gradients_and_state():
    f32 = _by_name(torch_training(lambda: mlp(256), (16,), batch_size=64))
    bf16 = _by_name(torch_training(lambda: mlp(256), (16,), batch_size=64, dtype="bfloat16"))
    assert bf16["network weights"] * 2 == f32["network weights"]
    assert bf16["network gradients"] * 2 == f32["network gradients"]
    # Adam's step counters stay float32 scalars (4 B each, 6 params)
    assert (bf16["network optimizer state"] - 24) * 2 == f32["network optimizer state"] - 24


def test_autocast_keeps_fp32_weights_and_halves_saved_activations():
    kw = dict(batch_size=2048)
    f32 = _by_name(torch_training(lambda: mlp(256), (16,), **kw))
    amp = _by_name(torch_training(lambda: mlp(256), (16,), autocast="bfloat16", **kw))
    assert amp["network weights"] == f32["network weights"]
    assert amp["network gradients"] == f32["network gradients"]
    assert amp["network activations"] < 0.75 * f32["network activations"]
    meta = torchnet.trace(lambda: mlp(32), (16,), batch_size=16, autocast="bfloat16")
    real = torchnet.trace(lambda: mlp(32), (16,), batch_size=16, autocast="bfloat16", device="cpu")
    assert meta.device == "fake"
    assert _rel(meta.peak, real.peak) <= 0.01


def test_several_networks_updated_in_one_step():
    nets = {"actor": lambda: mlp(32), "critic": lambda: Dueling(16, 48, 1)}
    fp = torch_training(nets, (16,), batch_size=16, frozen={"critic": 1})
    names = _by_name(fp)
    actor = _by_name(torch_training(nets["actor"], (16,), batch_size=16))
    critic = _by_name(torch_training(nets["critic"], (16,), batch_size=16))
    assert names["network actor weights"] == actor["network weights"]
    assert names["network critic weights"] == critic["network weights"]
    assert names["network critic frozen weights"] == critic["network weights"]
    assert "network actor frozen weights" not in names
    assert names["network actor optimizer state"] == actor["network optimizer state"]
    meta = torchnet.trace(nets, (16,), batch_size=16, frozen={"critic": 1})
    real = torchnet.trace(nets, (16,), batch_size=16, frozen={"critic": 1}, device="cpu")
    assert _rel(meta.peak, real.peak) <= 0.01
    assert _traced(fp) == meta.peak


# --------------------------------------------------------------------------------------------------------
# Cache and threads
# --------------------------------------------------------------------------------------------------------
def test_cache_hit_returns_same_result_without_building():
    calls = []

    def factory():
        calls.append(1)
        return mlp(64)

    first = torch_training(factory, (16,), batch_size=32, cache_key=("mlp", 64))
    n = len(calls)
    second = torch_training(factory, (16,), batch_size=32, cache_key=("mlp", 64))
    assert second == first
    assert len(calls) == n  # a cache_key hit builds nothing
    # without a key the module is built (on meta) to derive one; the trace is still reused
    third = torch_training(factory, (16,), batch_size=32)
    fourth = torch_training(factory, (16,), batch_size=32)
    assert third == fourth == first
    assert len(torchnet.cached_entries()) == 2


def test_cache_distinguishes_specs():
    a = torch_training(mlp, (16,), batch_size=8, cache_key="m", optimizer="adam")
    b = torch_training(mlp, (16,), batch_size=8, cache_key="m", optimizer="sgd")
    c = torch_training(mlp, (16,), batch_size=8, cache_key="m", device="cuda")
    assert a != b and a.ram != c.ram
    assert len(torchnet.cached_entries()) == 3


def test_threads_share_the_cache_safely():
    widths = [16, 32, 48, 64] * 4
    expected = {w: torch_training(lambda w=w: mlp(w), (16,), batch_size=8).ram for w in set(widths)}
    torchnet.clear_cache()

    def run(w):
        return w, torch_training(lambda: mlp(w), (16,), batch_size=8).ram

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, widths))
    assert all(ram == expected[w] for w, ram in results)


# --------------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(batch_size=0), "batch_size must be a positive int, but got 0"),
        (dict(batch_size=-3), "but got -3"),
        (dict(batch_size=True), "but got True"),
        (dict(batch_size=8, optimizer="adagrad_typo"), "optimizer must be a torch.optim optimizer"),
        (dict(batch_size=8, optimizer=("lbfgs", {})), "optimizer LBFGS cannot be traced"),
        (dict(batch_size=8, dtype="float8"), "dtype must be one of 'float32'"),
        (dict(batch_size=8, input_dtype="complex64"), "input_dtype must be one of"),
        (dict(batch_size=8, autocast="float32"), "autocast must be one of 'float16', 'bfloat16', but got 'float32'"),
        (dict(batch_size=8, accumulation_steps=0), "accumulation_steps must be a positive int, but got 0"),
        (dict(batch_size=8, frozen=-1), "frozen must be a non-negative int"),
        (dict(batch_size=8, frozen={"critic": 1}), "frozen must be a non-negative int"),
        (dict(batch_size=8, device="tpu"), "device must be 'cpu', 'cuda' or 'cuda:N', but got 'tpu'"),
        (dict(batch_size=8, optimizer=("sgd", {"nesterov_typo": 1})), "rejected its kwargs"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_value(kwargs, fragment):
    with pytest.raises(ValueError) as info:
        torch_training(mlp, (16,), **kwargs)
    assert fragment in str(info.value)
    assert isinstance(info.value, EstimateError)


def test_bad_model_and_shapes():
    with pytest.raises(ValueError, match="must be a factory returning a torch.nn.Module, but it returned int"):
        torch_training(lambda: 3, (16,), batch_size=8)
    with pytest.raises(ValueError, match="must be a factory returning an nn.Module"):
        torch_training("mlp", (16,), batch_size=8)
    with pytest.raises(ValueError, match=r"input_shape must be a tuple of positive ints .* but got \(16, 0\)"):
        torch_training(mlp, (16, 0), batch_size=8)
    with pytest.raises(ValueError, match="input_shape as a dict must give a shape for every network"):
        torch_training({"a": mlp, "b": mlp}, {"a": (16,)}, batch_size=8)
    with pytest.raises(ValueError, match="tracing the network's step on the meta device failed"):
        torch_training(mlp, (15,), batch_size=8)  # shape mismatch inside the model
    with pytest.raises(ValueError, match="cache_key must be hashable"):
        torch_training(mlp, (16,), batch_size=8, cache_key=["not", "hashable"])


def test_shared_module_returned_by_a_factory_is_not_changed():
    # recipes hand out a cached meta module from their factories; tracing must leave it as it was
    with torch.device("meta"):
        shared = mlp(32)
    fp = torch_training({"q_net": lambda: shared}, (16,), batch_size=8, frozen={"q_net": 1})
    assert fp.ram > 0
    assert all(p.grad is None and p.requires_grad and p.device.type == "meta" for p in shared.parameters())
    real = torchnet.trace({"q_net": lambda: shared}, (16,), batch_size=8, frozen={"q_net": 1}, device="cpu")
    assert _rel(_traced(fp), real.peak) <= 0.01


def test_allocator_timeline_repeats_the_step_without_leaking():
    # Two replayed steps: the second frees the first one's gradients; what stays is the persistent state.
    factory, shape, input_dtype = ARCHS["nature_dqn"]
    trace = torchnet.trace(factory, shape, batch_size=16, input_dtype=input_dtype, target="cuda")
    events = torchnet.allocator_events(trace.structure, trace.sizes, steps=2)
    live: dict[int, int] = {}
    for handle, nbytes in events:
        if nbytes >= 0:
            assert handle not in live
            live[handle] = nbytes
        else:
            assert live.pop(handle, None) is not None  # every free frees something allocated
    persistent = torchnet.analyse(trace.structure, trace.sizes, device_only=True)
    assert sum(live.values()) == sum(sum(row) for row in persistent.final)
    peaks = allocator.replay(events)
    assert peaks.peak_allocated >= persistent.peak


# --------------------------------------------------------------------------------------------------------
# The package's layout
# --------------------------------------------------------------------------------------------------------
def test_workspaces_module_imports_without_the_rest_of_the_tracer():
    # the calibration's kernel probe imports it in a fresh interpreter, whose baseline must stay small
    code = (
        "import sys; from optuna_memprune.estimate.torchnet import workspaces; "
        "print(workspaces.WORKSPACE_RULES == ('conv_fwd_in', 'conv_fwd_out', 'conv_bwd_in', 'conv_bwd_out', "
        "'conv_bwd_grad_in'), workspaces.channel_block() in (8, 16), "
        "sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('optuna_memprune.estimate.torchnet.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "['workspaces']"]


def test_workspace_features_of_a_convolution():
    from optuna_memprune.estimate.torchnet.workspaces import WORKSPACE_RULES, workspace_features

    aten = torch.ops.aten
    x, w = torch.empty(2, 32, 10, 10, device="meta"), torch.empty(40, 32, 3, 3, device="meta")
    y = aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    feats = dict(workspace_features(aten.convolution.default, (x, w, None), {}, y, 16))
    assert feats == {
        WORKSPACE_RULES.index("conv_fwd_out"): 2 * 48 * 100 * 4,  # 40 channels padded to 48
        WORKSPACE_RULES.index("conv_fwd_in"): 2 * 32 * 100 * 4,
    }
    assert workspace_features(aten.mm.default, (x, w), {}, y, 16) == []


def test_public_names_of_the_package():
    assert torchnet.torch_training is torch_training and torchnet.torch_inference is torch_inference
    assert omp_estimate.torch_training is torch_training
    with pytest.raises(AttributeError):
        torchnet.no_such_name
