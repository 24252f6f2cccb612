"""The learned footprint's features: which params take memory by their name and type, and params encoded as
non-negative features that grow in the direction that takes memory.

Owns the name vocabulary (``role``), the encoder of params into feature rows (``Encoder``) and the
directions read from the data. Knows nothing of fitting, bounds, Optuna or records.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

import numpy as np

from ..exceptions import EstimateError

#: Words of a param's name that say it sizes something held in memory (``batch_size``, ``n_layers``,
#: ``hidden_dim``, ``num_leaves``, ``max_bin``, ``buffer_size``, ``seq_len``, ``n_envs``, ``frame_stack``).
SIZE_WORDS = frozenset(
    "batch width hidden units unit neurons nodes layers layer depth size sizes buffer maxlen len length seq "
    "sequence envs env stack frames leaves leaf bins bin rows cols columns estimators trees channels filters "
    "dim dims embd emb embed embedding heads vocab capacity memory steps quantiles features tokens context block "
    "blocks workers samples resolution".split()
)
#: Words that say it takes no memory (rates, coefficients, seeds): ``learning_rate``, ``lr``, ``gamma``,
#: ``dropout``, ``weight_decay``, ``seed``, ``clip_range``, ``momentum``, ``beta1``, ``eps``, ``temperature``,
#: ``ent_coef``, ``gae_lambda``, ``tau``, ``reg_alpha``, ``max_grad_norm``. They win over a size word
#: (``batch_norm_momentum`` is a momentum).
NO_MEMORY_WORDS = frozenset(
    "lr rate gamma dropout decay wd seed clip momentum beta eps epsilon temperature temp alpha lambda lam "
    "tau coef coefficient noise std sigma reg penalty smoothing norm threshold l1 l2".split()
)
_DECADE = 10.0  # a positive numeric param spanning this ratio also gets a log feature


class Role(str, Enum):
    """What a param's name and type say of its memory before any trial: ``size`` (it takes memory as it
    grows: name words or an int), ``none`` (a rate, a coefficient, a seed: no effect unless the data show
    one beyond the fit's noise, and never clamped), ``other`` (a float or a label the name says nothing of:
    in the fit only where the data show an effect)."""

    SIZE = "size"
    NONE = "none"
    OTHER = "other"


def words(name: str) -> list[str]:
    """``"batchSize"`` -> ``["batch", "size"]``; ``"beta1"`` -> ``["beta1", "beta"]``."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).lower()
    out = []
    for w in re.findall(r"[a-z]+[0-9]*", spaced):
        out += [w, w.rstrip("0123456789")] if w[-1].isdigit() else [w]
    return out


def role(name: str, values: Iterable[Any] = ()) -> Role:
    """The role of param ``name`` whose trials held ``values`` (see ``Role``).

    Examples:
        >>> role("learning_rate"), role("batch_size"), role("n_units", [64]), role("warmup", [0.1])
        (<Role.NONE: 'none'>, <Role.SIZE: 'size'>, <Role.SIZE: 'size'>, <Role.OTHER: 'other'>)
    """
    said = set(words(name))
    if said & NO_MEMORY_WORDS:
        return Role.NONE
    if said & SIZE_WORDS:
        return Role.SIZE
    values = [v for v in values if v is not None]
    if values and all(
        is_number(v) and float(v).is_integer() and not isinstance(v, (float, np.floating)) for v in values
    ):
        return Role.SIZE  # an int of no known name: a count, most often of something held
    return Role.OTHER


@functools.lru_cache(maxsize=4096)  # a pure function of the name, asked per trial run and param by every bound
def grows(name: str) -> bool:
    """Whether the name alone says memory grows with the param: a size word, no word of no memory, no
    ``min`` (``min_child_samples``, ``min_samples_leaf``: larger is fewer, smaller nodes).

    Examples:
        >>> grows("per_device_train_batch_size"), grows("n_layer"), grows("min_child_samples"), grows("n_iter")
        (True, True, False, False)
    """
    said = set(words(name))
    return bool(said & SIZE_WORDS) and not said & NO_MEMORY_WORDS and "min" not in said


class Encoder:
    """Params -> feature rows ``[1, linear..., logs..., products..., labels...]``, each feature non-negative
    and growing in the direction that takes memory (``x`` scaled to its observed range)."""

    def __init__(self) -> None:
        self.numeric: dict[str, tuple[float, float, int, bool]] = {}  # name -> (lo, hi, direction, log)
        self.labels: dict[str, list[Any]] = {}
        self.roles: dict[str, Role] = {}
        self.products = False
        self.resource = ""  # corrected mode: the footprint's figure of this resource is the feature
        self.scale = 1.0  # corrected mode: that figure's scale

    @property
    def directions(self) -> dict[str, int]:
        return {n: d for n, (_, _, d, _) in self.numeric.items()}

    @property
    def params(self) -> list[str]:
        return [*self.numeric, *self.labels]

    @classmethod
    def corrected(cls, resource: str, rows: list[Any]) -> Encoder:
        enc = cls()
        enc.resource = resource
        enc.scale = max([float((o.predicted or {}).get(resource) or 0) for o in rows] + [1.0])
        return enc

    @classmethod
    def of(cls, settings: Any, rows: list[Any], y: np.ndarray) -> Encoder:
        """Every param the trials (``learn.Observation``) vary, with its role (``settings``:
        ``learn.Learned``); numeric directions +1 unless declared or read from the data (``direction``)."""
        enc = cls()
        for name in sorted({n for o in rows for n in o.params}):
            values = [o.params.get(name) for o in rows]
            enc.roles[name] = role(name, values)
            if name in settings.categorical or not all(is_number(v) for v in values if v is not None):
                labels: list[Any] = []
                for v in values:
                    if v not in labels:
                        labels.append(v)
                if len(labels) > 1:
                    enc.labels[name] = labels
                continue
            known = [(float(v), yy) for v, yy in zip(values, y, strict=False) if v is not None]
            lo, hi = min(v for v, _ in known), max(v for v, _ in known)
            if hi <= lo:
                continue  # one value seen: nothing to learn from it
            use_log = name in settings.log or (lo > 0 and hi / lo >= _DECADE)
            if use_log and lo <= 0:
                raise EstimateError(f"log param {name!r} must be positive, but the trials hold {lo!r}.")
            enc.numeric[name] = (lo, hi, settings.monotone.get(name) or direction(known), use_log)
        return enc

    def only(self, names: Iterable[str], products: bool | None = None) -> Encoder:
        """This encoder restricted to ``names`` (and with or without products)."""
        keep = set(names)
        other = Encoder()
        other.numeric = {n: v for n, v in self.numeric.items() if n in keep}
        other.labels = {n: v for n, v in self.labels.items() if n in keep}
        other.roles = self.roles
        other.products = self.products if products is None else products
        return other

    def plus(self, full: Encoder, name: str) -> Encoder:
        """This encoder with ``full``'s encoding of ``name`` added."""
        other = self.only(self.params)
        if name in full.numeric:
            other.numeric[name] = full.numeric[name]
        else:
            other.labels[name] = full.labels[name]
        return other

    def flipped(self, name: str) -> Encoder:
        other = self.only(self.params)
        lo, hi, d, use_log = other.numeric[name]
        other.numeric[name] = (lo, hi, -d, use_log)
        return other

    def row(
        self, params: Mapping[str, Any], predicted: Mapping[str, float] | None = None, weights: np.ndarray | None = None
    ) -> np.ndarray:
        """The feature row of ``params``; a label no trial ran counts as the costliest seen (by ``weights``)."""
        if self.resource:  # corrected mode
            value = number((predicted or {}).get(self.resource))
            if value is None:
                raise EstimateError(
                    f"the footprint's {self.resource} figure must be a number, but got "
                    f"{(predicted or {}).get(self.resource)!r}."
                )
            return np.array([1.0, value / self.scale])
        linear, logs = [], []
        for name, (lo, hi, d, use_log) in self.numeric.items():
            raw = params.get(name)
            if raw is None:
                x = lo if d > 0 else hi  # absent (another branch): the least memory this param takes
            elif not is_number(raw):
                raise EstimateError(f"param {name!r} must be a number (the trials gave numbers), but got {raw!r}.")
            else:
                x = float(raw)
            u = (x - lo) / (hi - lo) if d > 0 else (hi - x) / (hi - lo)
            linear.append(max(u, 0.0))  # below the range seen: as at its low end (a bound errs high there)
            if use_log:
                if x <= 0:
                    raise EstimateError(f"param {name!r} must be positive (it is on a log scale), but got {raw!r}.")
                v = math.log(x / lo) / math.log(hi / lo)
                logs.append(max(v if d > 0 else 1.0 - v, 0.0))
        feats = [1.0, *linear, *logs]
        if self.products:
            feats += [a * b for i, a in enumerate(linear) for b in linear[i:]]
        for name, labels in self.labels.items():
            value = params.get(name)
            if value not in labels and weights is not None:  # a label no trial ran: the costliest seen
                block = weights[len(feats) : len(feats) + len(labels)]
                value = labels[int(np.argmax(block))]
            feats += [1.0 if value == lab else 0.0 for lab in labels]
        return np.array(feats)

    def matrix(self, rows: list[Any]) -> np.ndarray:
        return np.array([self.row(o.params, o.predicted) for o in rows])

    def groups(self) -> dict[str, list[int]]:
        """Each param's feature columns (a product belongs to both of its params)."""
        names = list(self.numeric)
        out: dict[str, list[int]] = {n: [1 + i] for i, n in enumerate(names)}
        col = 1 + len(names)
        for n, (_, _, _, use_log) in self.numeric.items():
            if use_log:
                out[n].append(col)
                col += 1
        if self.products:
            for i, a in enumerate(names):
                for b in names[i:]:
                    out[a].append(col)
                    if b != a:
                        out[b].append(col)
                    col += 1
        for n, labels in self.labels.items():
            out[n] = list(range(col, col + len(labels)))
            col += len(labels)
        return out

    def effects(self, x: np.ndarray, weights: np.ndarray) -> dict[str, float]:
        """How much each param moves the fit across the trials seen: the spread of its features' share."""
        out = {}
        for name, cols in self.groups().items():
            share = x[:, cols] @ weights[cols]
            out[name] = float(share.max() - share.min()) if len(share) else 0.0
        return out


def direction(known: list[tuple[float, float]], least: int = 20) -> int:
    """+1 unless the peak clearly falls as the param grows (Spearman's rank correlation below -0.5 over at
    least ``least`` trials): memory's usual direction stands until the data say otherwise."""
    if len(known) < least:
        return 1
    rx, ry = ranks(np.array([v for v, _ in known])), ranks(np.array([y for _, y in known]))
    if rx.std() == 0 or ry.std() == 0:
        return 1
    return -1 if float(np.corrcoef(rx, ry)[0, 1]) < -0.5 else 1


def ranks(a: np.ndarray) -> np.ndarray:
    order = a.argsort(kind="mergesort")
    out = np.empty(len(a))
    out[order] = np.arange(len(a))
    for v in np.unique(a):  # ties share their mean rank
        out[a == v] = out[a == v].mean()
    return out


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(float(v))


def number(v: Any) -> float | None:
    return float(v) if is_number(v) else None
