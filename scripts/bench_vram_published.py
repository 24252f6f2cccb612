"""VRAM predictions held to published GPU measurements: the xMem paper's released training runs.

Reads ``scripts/data/xmem_runs*.csv`` (runs transcribed from the public repository ``Stone-ResearchLife/xMem``,
``plot/data/**/evaluation_result.json``; each row names its file in ``path``), rebuilds every run on the meta
device as the xMem workload states it, predicts its peak with the public
``optuna_memprune.estimate.torch_training(..., device="cuda")`` and prints, per row, the NVML ground figure,
ours, xMem's, DNNMem's and SchedTune's; then per family (CNN, transformer) and overall, and a last line
``VRAM_PUBLISHED n=.. supported=.. ours_median_err=..% ours_under=.. ours_max_err=..% xmem_median_err=..%
xmem_under=.. dnnmem_median_err=..% schedtune_median_err=..%``.

What is rebuilt (the workload of xMem's ``exp/`` and ``perf_estimator/`` code):
- CNNs: torchvision constructors, ``weights=None``, fp32, 1000 classes except MobileNetV3 small/large and
  MNASNet (10); input ``[B,3,86,86]`` float32 plus int64 labels ``[B]``; ``CrossEntropyLoss``.
- Transformers: Hugging Face models built from a config written here with each model's published sizes
  (random init, nothing downloaded); causal-LM (T5: seq2seq) loss with labels = input_ids. **The prediction
  assumes a sequence length of 128**, the truncation limit: wikitext batches are padded to their longest
  line, and with 5 or more lines per batch over 4 batches some line almost surely reaches 128 tokens (the
  batch-1 A100 rows may be shorter: there the figure is an upper bound). Where these models branch on tensor
  values, the branch is the real run's: OPT's LayerDrop draw keeps every layer (layerdrop 0), the SDPA
  "all-ones mask?" check answers False for a padded batch of 2+ lines (True for one line); the rotary
  embeddings' disabled ``torch.autocast(device_type="meta")`` is entered as "cpu" (it does nothing either way).
- Optimizer: the ``torch.optim`` class named in the row (Adagrad included), lr=0.001, every other argument
  torch's default (SGD without momentum); the transformer rows' Adafactor is Hugging Face's with
  ``relative_step=False``; ``foreach`` as torch picks it on CUDA (the tracer's default for ``device="cuda"``).
  CNN rows also step xMem's ``StepLR(step_size=7, gamma=0.1)`` (no memory of its own; traced to show it).
- zero_grad position: the tracer's step zeroes gradients just before ``backward``, which is xMem's mode 1
  (previous step's gradients alive during the forward). Modes 0 (zero at the top of the iteration) and 2
  (zero after ``step``) leave the same tensors alive at every point that matters; they are rebuilt by a
  wrapper module whose ``forward`` first sets every ``p.grad = None``, which is what
  ``optimizer.zero_grad()`` does. ``null`` (older schema) is read as mode 1 (WORKLOAD.md: probable,
  uncertain) and also scored as mode 0: both readings are printed.
- Ours leaves out the ``CUDA context`` component: the ground figure is NVML's used memory minus its first
  sample, taken after CUDA was initialised on the device.
- Rows whose real run hit the GPU's limit (``real_oom=true``) are scored as a decision (did we predict more
  than the GPU's total memory?), not in the error figures. Peers are scored on the same rows as ours.
  ``n``: rows; ``supported``: rows we predict (OOM rows included); ``scored``: supported rows without OOM.

GPU-side costs, held to these rows (fits are reported with a held-out file, never scored on their own rows):
- Caching allocator over the runs' 4 steps: the model replays 2 steps; replaying 4 gives the same figure on
  each of 24 sampled CNN rows (the pattern is steady from step 2), so the 2-step component stands.
- Lazily loaded CUDA kernel modules and library handles (cuBLAS, cuDNN) outside the caching allocator: a
  constant (minimising the median error, CNN rows, primary reading, 10 MB steps) fitted on
  ``xmem_runs_more.csv`` comes out 0 MB (held out, ``xmem_runs.csv`` stays at 2.7%); fitted on
  ``xmem_runs.csv`` it comes out -30 MB (held out, ``xmem_runs_more.csv`` goes from 2.1% to 2.3%). The rows
  show no such constant beyond the parts already modelled (cuBLAS workspace, allocator): none is added.
- cuDNN convolution workspaces: the largest under-predictions (VGG19 -18%, MnasNet -17%, MobileNetV2 -12%)
  are rows where xMem's figure is as low as ours, while the same models are over-predicted by up to +18% on
  other rows; no rule per conv shape can be read from figures without the GPU: not added.
- CUDA context per GPU generation: the ground figure starts after CUDA's initialisation, so these rows say
  nothing of it; the ``CUDA context`` default stays (left out of every figure here).

What this does not prove: the runs were measured by others, on RTX 3060/4060 and A100 GPUs with torch 2.6 /
CUDA 12.4, while ours is traced with the torch installed here (CPU build) and no GPU of our own; nothing
here was measured on a GPU by this project. The ground figure's definition rests on reading xMem's code.

Needs torchvision (model definitions) and transformers (transformer rows; without it they print the reason),
installed without letting pip replace the CPU torch: ``pip install --no-deps torchvision==0.28.0`` and
``pip install --no-deps transformers==4.51.3 huggingface_hub==0.36.2 tokenizers==0.21.4 safetensors regex``.
Run: ``python scripts/bench_vram_published.py [--smoke] [--components]`` (``--smoke``: the first 5 rows;
``--components``: our components under each row). Diagnostic lines (signed error per model, optimizer and
zero_grad reading; ours without the allocator-overhead component) come before the summaries.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import statistics
import sys
import types
from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from optuna_memprune.estimate import torch_training  # noqa: E402

DATA = sorted((ROOT / "scripts" / "data").glob("xmem_runs*.csv"))
GB = 1e9
SEQ_LEN = 128
SMOKE_ROWS = 5
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs are built here: never reach a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


# ---------------------------------------------------------------------------------------------------------
# Model definitions
# ---------------------------------------------------------------------------------------------------------
def _torchvision_models():
    """``torchvision.models`` without torchvision's compiled ops.

    The torchvision wheel on PyPI is built for the CUDA torch; with a CPU torch its ``_C`` library does not
    load, and ``import torchvision`` then fails in ``torchvision/_meta_registrations.py``, which registers
    meta kernels for those C ops (nms, roi_align, deform_conv2d: detection ops, not used by classification
    models) and raises "operator torchvision::nms does not exist". That one module is replaced by an empty
    one before the import; the model definitions are pure Python and untouched.
    """
    name = "torchvision._meta_registrations"
    if "torchvision" not in sys.modules and name not in sys.modules:
        sys.modules[name] = types.ModuleType(name)
    import torchvision.models as tvm

    return tvm


def cnn_factory(model: str):
    """xMem's ``perf_estimator/models.py`` ``AllModels`` entry for ``model`` (the names as in the data)."""
    tvm = _torchvision_models()
    table = {
        "VGG16": lambda: tvm.vgg16(weights=None),
        "VGG19": lambda: tvm.vgg19(weights=None),
        "ResNet101": lambda: tvm.resnet101(weights=None),
        "ResNet152": lambda: tvm.resnet152(weights=None),
        "MobileNetV2": lambda: tvm.mobilenet_v2(weights=None),
        "MobeNetV3Small": lambda: tvm.mobilenet_v3_small(num_classes=10),  # = MobileNetV3(small, 1024, 10)
        "MobeNetV3Large": lambda: tvm.mobilenet_v3_large(num_classes=10),  # = MobileNetV3(large, 1280, 10)
        "MnasNet": lambda: tvm.mnasnet1_0(num_classes=10),  # = MNASNet(alpha=1.0, 10)
        "ConvNeXtTiny": lambda: tvm.convnext_tiny(weights=None),
        "ConvNeXtBase": lambda: tvm.convnext_base(weights=None),
        "RegNetX400MF": lambda: tvm.regnet_x_400mf(weights=None),
        "RegNetY400MF": lambda: tvm.regnet_y_400mf(weights=None),
    }
    return table[model]


def lm_factory(model: str):
    """A Hugging Face model from a config with the named checkpoint's published sizes (random init)."""
    _torchvision_models()  # transformers imports torchvision when it is installed: import it safely first
    import transformers as hf

    causal, seq2seq = hf.AutoModelForCausalLM.from_config, hf.AutoModelForSeq2SeqLM.from_config
    gpt2 = hf.GPT2Config  # defaults = gpt2 (124M): 12 layers, 768 wide, 12 heads, vocab 50257
    table = {
        "openai-community/gpt2": lambda: causal(gpt2()),
        "distilbert/distilgpt2": lambda: causal(gpt2(n_layer=6)),
        "cerebras/Cerebras-GPT-111M": lambda: causal(gpt2(n_layer=10, n_positions=2048, n_inner=3072)),
        "EleutherAI/gpt-neo-125M": lambda: causal(
            hf.GPTNeoConfig(
                hidden_size=768,
                num_layers=12,
                num_heads=12,
                attention_types=[[["global", "local"], 6]],
                max_position_embeddings=2048,
                window_size=256,
            )
        ),
        "facebook/opt-125m": lambda: causal(hf.OPTConfig()),  # defaults = opt-125m
        "facebook/opt-350m": lambda: causal(
            hf.OPTConfig(
                hidden_size=1024,
                num_hidden_layers=24,
                ffn_dim=4096,
                num_attention_heads=16,
                word_embed_proj_dim=512,
                do_layer_norm_before=False,
            )
        ),
        "T5-small": lambda: seq2seq(hf.T5Config(decoder_start_token_id=0)),  # defaults = t5-small
        "t5-base": lambda: seq2seq(
            hf.T5Config(d_model=768, d_ff=3072, num_layers=12, num_heads=12, decoder_start_token_id=0)
        ),
        "Qwen/Qwen3-4B": lambda: causal(
            hf.Qwen3Config(
                vocab_size=151936,
                hidden_size=2560,
                intermediate_size=9728,
                num_hidden_layers=36,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=128,
                tie_word_embeddings=True,
            )
        ),
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": lambda: causal(
            hf.Qwen2Config(
                vocab_size=151936,
                hidden_size=1536,
                intermediate_size=8960,
                num_hidden_layers=28,
                num_attention_heads=12,
                num_key_value_heads=2,
                tie_word_embeddings=False,
            )
        ),
        "google/gemma-2-2b-it": lambda: causal(
            hf.Gemma2Config(
                vocab_size=256000,
                hidden_size=2304,
                intermediate_size=9216,
                num_hidden_layers=26,
                num_attention_heads=8,
                num_key_value_heads=4,
                head_dim=256,
            )
        ),
        "meta-llama/Llama-3.2-3B-Instruct": lambda: causal(
            hf.LlamaConfig(
                vocab_size=128256,
                hidden_size=3072,
                intermediate_size=8192,
                num_hidden_layers=28,
                num_attention_heads=24,
                num_key_value_heads=8,
                head_dim=128,
                tie_word_embeddings=True,
            )
        ),
    }
    return table[model]


class CNNStep(nn.Module):
    """One iteration of xMem's ``conv_train_loop`` as the traced module: forward, labels, CE loss."""

    def __init__(self, net: nn.Module, zero_at_start: bool) -> None:
        super().__init__()
        self.net, self.zero_at_start, self.loss = net, zero_at_start, nn.CrossEntropyLoss()

    def forward(self, x):
        if self.zero_at_start:  # optimizer.zero_grad() (set_to_none) before the forward: modes 0, 2
            for p in self.net.parameters():
                p.grad = None
        labels = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        return self.loss(self.net(x), labels)


class LMStep(nn.Module):
    """One iteration of xMem's ``transformer_train_loop``: ``model(input_ids, labels).loss``.

    No attention mask is passed: Hugging Face's SDPA path checks an all-ones mask with a data-dependent
    ``torch.all(...)`` that cannot run on meta; the longest line of the batch has no padding anyway.
    """

    def __init__(self, net: nn.Module, zero_at_start: bool) -> None:
        super().__init__()
        self.net, self.zero_at_start = net, zero_at_start

    def forward(self, ids):
        if self.zero_at_start:
            for p in self.net.parameters():
                p.grad = None
        with _DataFreeChoices(), _meta_autocast_as_cpu():
            return self.net(input_ids=ids, labels=ids.clone()).loss  # the collator's labels: a copy of the ids


# ---------------------------------------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------------------------------------
def optimizer_arg(name: str, cnn: bool):
    """The row's optimizer as ``torch_training`` takes it: the ``torch.optim`` class, lr=0.001, every other
    argument torch's default; Adafactor (transformer rows) is Hugging Face's, ``relative_step=False``."""
    if name == "Adafactor":
        from transformers.optimization import Adafactor

        return (Adafactor, {"lr": 1e-3, "relative_step": False})
    return (getattr(torch.optim, name), {"lr": 1e-3})


# xMem's conv_train_loop steps StepLR(step_size=7, gamma=0.1) after every optimizer step (no memory of its own).
CNN_SCHEDULER = ("StepLR", {"step_size": 7, "gamma": 0.1})


@contextlib.contextmanager
def _meta_autocast_as_cpu():
    """Qwen's and Llama's rotary embeddings compute under ``torch.autocast(device_type=x.device.type,
    enabled=False)``, which torch refuses for "meta"; disabled autocast does nothing on any device, so
    "meta" is given as "cpu" for the forward's duration (torch.autocast restored after)."""
    real = torch.autocast

    def autocast(device_type, *args, **kwargs):
        return real("cpu" if device_type == "meta" else device_type, *args, **kwargs)

    torch.autocast = autocast
    try:
        yield
    finally:
        torch.autocast = real


class _DataFreeChoices(TorchFunctionMode):
    """The two places where these Hugging Face models branch on tensor values, answered as the real run does.

    - OPT's LayerDrop draws ``torch.rand([])`` and skips the layer when the draw is below ``layerdrop`` (0.0 in
      these configs: never): the draw is given as a CPU 1.0, which keeps every layer.
    - The SDPA mask check ``torch.all(attention_mask == 1)`` (OPT, Qwen, Llama: may the causal mask be
      dropped?): the collator pads each batch to its longest line, so with two or more lines some line is
      padded and the answer is False (a 4-D mask is built); with one line it is True.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            func is torch.rand
            and tuple(args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args) == ()
        ):
            return torch.ones((), device="cpu")
        if func is torch.all and len(args) == 1 and not kwargs and args[0].device.type == "meta":
            return torch.tensor(args[0].dim() > 0 and args[0].shape[0] == 1, device="cpu")
        return func(*args, **kwargs)


# Where a model fails on meta, what in its code does it (found by reading the traceback; for the reader).
KNOWN_CAUSES: dict[str, str] = {}


def predict(row: dict, zero_at_start: bool) -> tuple[int | None, dict | str]:
    """(bytes without the CUDA context, components) or (None, the one-line reason)."""
    model, cnn = row["model"], row["family"] == "CNN"
    try:
        make = cnn_factory(model) if cnn else lm_factory(model)
    except ImportError as e:
        return None, f"cannot import the model library: {e}"
    step = CNNStep if cnn else LMStep
    try:
        fp = torch_training(
            lambda: step(make(), zero_at_start),
            (3, 86, 86) if cnn else (SEQ_LEN,),
            input_dtype="float32" if cnn else "int64",
            batch_size=int(row["batch_size"]),
            optimizer=optimizer_arg(row["optimizer"], cnn),
            device="cuda",
            scheduler=CNN_SCHEDULER if cnn else None,
            cache_key=("xmem-published", model, zero_at_start),
        )
    except Exception as e:  # EstimateError from the tracer, or the model's own failure
        why = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        cause = KNOWN_CAUSES.get(model) if "optimizer must be" not in why else None
        return None, why + (f" [{cause}]" if cause else "")
    parts = {c.name: c.vram for c in fp.components if c.name != "CUDA context"}
    return sum(parts.values()), parts


def readings(mode: str) -> list[tuple[str, bool]]:
    """(label, zero_at_start) per reading of the row's zero_grad_mode; the first is the primary one."""
    if mode in ("0", "2"):
        return [(mode, True)]
    if mode == "1":
        return [("1", False)]
    return [("null=1", False), ("null=0", True)]


def load_rows(paths) -> list[dict]:
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                r["source"] = path.name
                rows.append(r)
    return rows


# ---------------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------------
def _num(text: str) -> float | None:
    return float(text) if text not in ("", None) else None


def _err(pred, ground) -> float:
    return abs(pred - ground) / ground


def summary(rows: list[dict], key: str) -> dict:
    """Error figures of ours (reading ``key``) and the peers on the rows we predict, OOM rows left out."""
    scored = [r for r in rows if r[key] is not None and r["real_oom"] != "true"]
    s = {"n": len(rows), "supported": sum(r[key] is not None for r in rows), "scored": len(scored)}
    if scored:
        errs = [_err(r[key], float(r["ground_bytes"])) for r in scored]
        s.update(
            ours_median=statistics.median(errs),
            ours_max=max(errs),
            ours_under=sum(r[key] < float(r["ground_bytes"]) for r in scored),
        )
    for peer, col in (("xmem", "xmem_bytes"), ("dnnmem", "dnnmem_bytes"), ("schedtune", "schedtune_bytes")):
        have = [r for r in scored if _num(r[col]) is not None]
        if have:
            s[f"{peer}_median"] = statistics.median(_err(float(r[col]), float(r["ground_bytes"])) for r in have)
            s[f"{peer}_under"] = sum(float(r[col]) < float(r["ground_bytes"]) for r in have)
            s[f"{peer}_rows"] = len(have)
    return s


def _pct(s: dict, k: str) -> str:
    return f"{100 * s[k]:.1f}%" if k in s else "n/a"


def print_summary(label: str, s: dict) -> None:
    print(
        f"{label:<26} n={s['n']} supported={s['supported']} scored={s['scored']} | ours median "
        f"{_pct(s, 'ours_median')} under {s.get('ours_under', 0)} max {_pct(s, 'ours_max')} | xMem median "
        f"{_pct(s, 'xmem_median')} under {s.get('xmem_under', 0)} | DNNMem median {_pct(s, 'dnnmem_median')} "
        f"under {s.get('dnnmem_under', 0)} | SchedTune median {_pct(s, 'schedtune_median')} "
        f"({s.get('schedtune_rows', 0)} rows)"
    )


def print_oom(rows: list[dict], key: str) -> None:
    oom = [r for r in rows if r["real_oom"] == "true"]
    have = [r for r in oom if r[key] is not None]
    total = lambda r: float(r["total_gpu_memory"])  # noqa: E731
    said = sum(r[key] > total(r) for r in have)
    with_ctx = sum(r[key] + r["context"] > total(r) for r in have)
    peers = {
        p: sum(float(r[c]) > total(r) for r in have if _num(r[c]) is not None)
        for p, c in (("xMem", "xmem_bytes"), ("DNNMem", "dnnmem_bytes"), ("SchedTune", "schedtune_bytes"))
    }
    print(
        f"OOM decision ({key}): {len(oom)} real-OOM rows, {len(have)} predicted; ours > GPU total: {said} "
        f"(with our default CUDA context added: {with_ctx}); on the same rows xMem {peers['xMem']}, "
        f"DNNMem {peers['DNNMem']}, SchedTune {peers['SchedTune']}"
    )
    ran = [r for r in rows if r["real_oom"] != "true" and r[key] is not None]  # false alarms: ran, we said OOM
    alarms = {
        p: sum(float(r[c]) > total(r) for r in ran if _num(r[c]) is not None)
        for p, c in (("xMem", "xmem_bytes"), ("DNNMem", "dnnmem_bytes"), ("SchedTune", "schedtune_bytes"))
    }
    print(
        f"  false alarms: of {len(ran)} rows that ran, predicted above the GPU total: ours "
        f"{sum(r[key] > total(r) for r in ran)}, xMem {alarms['xMem']}, DNNMem {alarms['DNNMem']}, "
        f"SchedTune {alarms['SchedTune']}"
    )


def print_groups(rows: list[dict], key: str, field: str, suffix: str = "") -> None:
    """Signed error of ours per model or optimizer (non-OOM rows we predict), for the diagnosis."""
    groups: dict[str, list] = {}
    for r in rows:
        if r[key] is not None and r["real_oom"] != "true":
            groups.setdefault(r[field], []).append(r)
    for name, rs in sorted(groups.items()):
        signed = [(r[key] - float(r["ground_bytes"])) / float(r["ground_bytes"]) for r in rs]
        pk = "parts" if key == "ours" else "parts_alt"
        over = statistics.median(r[pk].get("network allocator overhead", 0) / r[key] for r in rs)
        print(
            f"  {name + suffix:<28} rows={len(rs):<3} signed err median {100 * statistics.median(signed):+6.1f}% "
            f"min {100 * min(signed):+6.1f}% max {100 * max(signed):+6.1f}% | allocator overhead "
            f"{100 * over:4.1f}% of ours"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help=f"only the first {SMOKE_ROWS} rows")
    ap.add_argument("--components", action="store_true", help="print our components (GB) under each row")
    args = ap.parse_args()
    rows = load_rows(DATA)
    if args.smoke:
        rows = rows[:SMOKE_ROWS]
    from optuna_memprune.estimate import allocator

    context = allocator.CUDA_CONTEXT_BYTES
    gpu = lambda r: r["gpu_name"].replace("NVIDIA ", "").replace("GeForce ", "")  # noqa: E731
    gb = lambda x: f"{float(x) / GB:6.2f}" if x not in ("", None) else "   n/a"  # noqa: E731
    print("GB = 1e9 B; ours without the CUDA context; err = (ours - ground) / ground; zg = zero_grad_mode read")
    print(
        f"{'experiment':<23}{'model':<28}{'optim':<10}{'batch':>5} {'GPU':<16}{'zg':<7}{'ground':>7}"
        f"{'ours':>7}{'xMem':>7}{'DNNMem':>7}{'SchedT':>7}   err"
    )
    for r in rows:
        r["context"] = context
        r["family_group"] = "CNN" if r["family"] == "CNN" else "transformer"
        first = True
        for label, zero_at_start in readings(r["zero_grad_mode"]):
            pred, parts = predict(r, zero_at_start)
            key = "ours" if first else "ours_alt"
            r[key], r["parts" if first else "parts_alt"] = pred, parts if pred is not None else {}
            head = (
                (
                    f"{r['experiment']:<23}{r['model'][:27]:<28}{r['optimizer']:<10}{r['batch_size']:>5} "
                    f"{gpu(r):<16}{label:<7}{gb(r['ground_bytes'])} "
                )
                if first
                else f"{'':<89}{label:<7}{'':>7} "
            )
            if pred is None:
                print(f"{head}  -- not predicted: {parts}")
            else:
                err = (pred - float(r["ground_bytes"])) / float(r["ground_bytes"])
                oom = " real OOM: scored as a decision" if r["real_oom"] == "true" else ""
                print(
                    f"{head}{gb(pred)}{gb(r['xmem_bytes'])}{gb(r['dnnmem_bytes'])}{gb(r['schedtune_bytes'])}"
                    f"  {100 * err:+6.1f}%{oom}"
                )
                if args.components:
                    print(
                        f"{'':<30}" + ", ".join(f"{k.replace('network ', '')} {v / GB:.2f}" for k, v in parts.items())
                    )
            first = False
        if "ours_alt" not in r:  # one reading only: the alternative is the same figure
            r["ours_alt"], r["parts_alt"] = r["ours"], r["parts"]
    print()
    print("Signed error per model (primary reading):")
    print_groups(rows, "ours", "model")
    print("Signed error per optimizer (primary reading):")
    print_groups(rows, "ours", "optimizer")
    print("Signed error per zero_grad_mode in the data, each reading:")
    print_groups(rows, "ours", "zero_grad_mode")
    print_groups([r for r in rows if r["zero_grad_mode"] == "null"], "ours_alt", "zero_grad_mode", " (read as 0)")
    print("Diagnostic, not a prediction: ours without the allocator-overhead component (tensor peak + cuBLAS):")
    for key, parts in (("ours", "parts"), ("ours_alt", "parts_alt")):
        for r in rows:
            r[key + "_tensors"] = None if r[key] is None else r[key] - r[parts].get("network allocator overhead", 0)
        s = summary(rows, key + "_tensors")
        print(f"  {key:<9} median {_pct(s, 'ours_median')} under {s.get('ours_under', 0)} of {s['scored']}")
    print()
    for key, what in (("ours_alt", "null read as mode 0"), ("ours", "null read as mode 1 (primary)")):
        print(f"-- {what}")
        for fam in ("CNN", "transformer"):
            print_summary(f"{fam}", summary([r for r in rows if r["family_group"] == fam], key))
        if len({r["source"] for r in rows}) > 1:
            for src in sorted({r["source"] for r in rows}):
                print_summary(f"{src}", summary([r for r in rows if r["source"] == src], key))
        print_summary("overall", summary(rows, key))
        print_oom(rows, key)
    s = summary(rows, "ours")
    f = lambda k: f"{100 * s[k]:.1f}" if k in s else "nan"  # noqa: E731
    print(
        f"VRAM_PUBLISHED n={s['n']} supported={s['supported']} ours_median_err={f('ours_median')}% "
        f"ours_under={s.get('ours_under', 0)} ours_max_err={f('ours_max')}% xmem_median_err={f('xmem_median')}% "
        f"xmem_under={s.get('xmem_under', 0)} dnnmem_median_err={f('dnnmem_median')}% "
        f"schedtune_median_err={f('schedtune_median')}%"
    )


if __name__ == "__main__":
    main()
