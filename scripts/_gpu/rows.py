"""Which networks, batches and optimizers the GPU check measures, and the VRAM prediction of each.

Owns the fixed set of VRAM cases and the networks of the project's studies as the check builds them; knows
nothing of CUDA (predictions are traced on the meta device, so they run on any machine) or of scoring.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parents[1]
ROOT = SCRIPTS.parent
for _p in (str(ROOT), str(SCRIPTS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

CNN_INPUT = (3, 224, 224)  # ImageNet-sized images, float32, int64 labels (the models' own 1000 classes)
SEQ_LEN = 128  # transformer rows: token ids of this length, labels = the ids
FRAME_STACK, FRAME, N_ACTIONS = 4, (84, 84), 6  # Atari frames as SB3's AtariWrapper + VecFrameStack(4) give them
STEPS = 4  # real training steps per measured row (xMem's runs measured 4 too)

# family, model name (bench_vram_published's tables for CNN/transformer), batches
MODELS: dict[str, tuple[str, tuple[int, ...]]] = {
    "ResNet101": ("CNN", (16, 32, 64)),
    "VGG16": ("CNN", (16, 32, 64)),
    "MobileNetV2": ("CNN", (16, 32, 64)),
    "ConvNeXtTiny": ("CNN", (16, 32, 64)),
    "openai-community/gpt2": ("transformer", (4, 8, 16)),
    "facebook/opt-125m": ("transformer", (4, 8, 16)),
    "dqn-nature": ("rl", (32, 256, 1024)),
    "ppo-nature": ("rl", (32, 256, 1024)),
}
OPTIMIZERS = ("Adam", "SGD")
RL_OPTIMIZERS = ("Adam",)  # what SB3's DQN and PPO use
BENCHMARK = (False, True)  # torch.backends.cudnn.benchmark, off then on


@dataclass(frozen=True)
class VramCase:
    """One predicted network step: measured on the GPU once per ``cudnn.benchmark`` setting."""

    family: str  # "CNN", "transformer" or "rl"
    model: str
    batch: int
    optimizer: str

    @property
    def key(self) -> str:
        return f"{self.model}|b{self.batch}|{self.optimizer}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cases(*, smoke: bool = False, models: tuple[str, ...] | None = None) -> list[VramCase]:
    """The VRAM cases, model by model. ``smoke``: the smallest batch and Adam only (a first, quick call)."""
    out = []
    for model in models or tuple(MODELS):
        if model not in MODELS:
            raise ValueError(f"models must name entries of MODELS {sorted(MODELS)}, but got {model!r}.")
        family, batches = MODELS[model]
        optimizers = RL_OPTIMIZERS if family == "rl" else OPTIMIZERS
        for batch in batches[:1] if smoke else batches:
            for opt in optimizers[:1] if smoke else optimizers:
                out.append(VramCase(family, model, batch, opt))
    return out


def by_model(selected: list[VramCase]) -> dict[str, list[VramCase]]:
    """The cases grouped per model, in order: one isolated check (one process) per model."""
    groups: dict[str, list[VramCase]] = {}
    for case in selected:
        groups.setdefault(case.model, []).append(case)
    return groups


# ----------------------------------------------------------------------------------------------------------
# The networks of the project's studies (studies/qnet_gpu.py, studies/ppo_pixels.py; SB3's NatureCNN)
# ----------------------------------------------------------------------------------------------------------
def _nature_trunk(channels: tuple[int, int, int, int] = (32, 64, 64, 512)):
    from torch import nn

    c1, c2, c3, hidden = channels
    return [
        nn.Conv2d(FRAME_STACK, c1, 8, 4),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 4, 2),
        nn.ReLU(),
        nn.Conv2d(c2, c3, 3, 1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(c3 * 7 * 7, hidden),
        nn.ReLU(),
    ]


def qnet(channels: tuple[int, int, int, int] = (32, 64, 64, 512)):
    """The Q-network of ``studies/qnet_gpu.py`` (NatureCNN and its wider variants), one output per action."""
    from torch import nn

    return nn.Sequential(*_nature_trunk(channels), nn.Linear(channels[3], N_ACTIONS))


def actor_critic():
    """SB3's ``ActorCriticCnnPolicy`` for Atari as ``studies/ppo_pixels.py`` trains it: NatureCNN shared by
    the policy head (one logit per action) and the value head, output concatenated."""
    import torch
    from torch import nn

    class ActorCritic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(*_nature_trunk())
            self.pi, self.vf = nn.Linear(512, N_ACTIONS), nn.Linear(512, 1)

        def forward(self, x):
            h = self.features(x)
            return torch.cat([self.pi(h), self.vf(h)], dim=1)

    return ActorCritic()


def factory(case: VramCase):
    """A zero-argument callable building the network the case trains (the step's loss inside for CNNs and
    transformers, as ``scripts/bench_vram_published.py`` traces them), and its frozen copies."""
    if case.family == "rl":
        return (qnet, 1) if case.model == "dqn-nature" else (actor_critic, 0)
    import bench_vram_published as published

    if case.family == "CNN":
        make = published.cnn_factory(case.model)
        return (lambda: published.CNNStep(make(), False)), 0
    make = published.lm_factory(case.model)
    return (lambda: published.LMStep(make(), False)), 0


def input_spec(case: VramCase) -> tuple[tuple[int, ...], str]:
    """(shape of one sample, dtype of the batch as it reaches the device)."""
    if case.family == "CNN":
        return CNN_INPUT, "float32"
    if case.family == "transformer":
        return (SEQ_LEN,), "int64"
    return (FRAME_STACK, *FRAME), "uint8"


def optimizer(case: VramCase):
    """The optimizer as ``torch_training`` takes it and as the real step builds it: (class, kwargs)."""
    import torch

    return getattr(torch.optim, case.optimizer), {"lr": 1e-3}


def predict(case: VramCase) -> dict[str, int]:
    """The case's VRAM prediction (``torch_training(..., device="cuda")``), by component, in bytes.

    The ``CUDA context`` component is the project's default, not a measurement: the rows score the rest
    against ``max_memory_reserved`` and the whole against NVML's per-process figure.
    """
    from optuna_memprune.estimate import torch_training

    make, frozen = factory(case)
    shape, dtype = input_spec(case)
    fp = torch_training(
        make,
        shape,
        batch_size=case.batch,
        input_dtype=dtype,
        optimizer=optimizer(case),
        frozen=frozen,
        device="cuda",
        cache_key=("gpu_check", case.model, case.optimizer),
    )
    return {c.name: c.vram for c in fp.components}


CONTEXT = "CUDA context"


def without_context(parts: dict[str, int]) -> int:
    """Predicted bytes inside the caching allocator (what ``max_memory_reserved`` counts)."""
    return sum(v for k, v in parts.items() if k != CONTEXT)


# ----------------------------------------------------------------------------------------------------------
# The small-card case (studies/qnet_gpu.py on a 3.7 GiB card): its sweep
# ----------------------------------------------------------------------------------------------------------
SMALL_CARD_BUDGET = "3.7GiB"
SMALL_CARD_VARIANTS = {
    "nature": (32, 64, 64, 512),
    "wide": (64, 128, 128, 1024),
    "large": (128, 256, 256, 2048),
    "xlarge": (256, 512, 512, 4096),
}
SMALL_CARD_BATCHES = (32, 128, 512, 1024)
SMALL_CARD_ENVS = (1, 4, 8, 16)
SMALL_CARD_STEPS = 2048  # replay steps per env kept on the GPU: n_envs x 2048 stacked uint8 frames


def replay_bytes(n_envs: int) -> int:
    """The GPU replay buffer of the small-card trial: observations and next observations, uint8."""
    return 2 * n_envs * SMALL_CARD_STEPS * FRAME_STACK * FRAME[0] * FRAME[1]
