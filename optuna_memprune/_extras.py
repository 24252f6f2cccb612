"""The optional parts of the install: which extra brings which module, and the one-line error a call that
needs a missing one raises.

The core (``pip install optuna-memprune``: Optuna, numpy, psutil) guards any study by learned footprints,
runs trials per process and prints the terminal report. The rest comes with an extra:
``pip install "optuna-memprune[torch]"`` and so on (``all`` for every one).

Owns the module -> extra table and the error's words; knows nothing of what the modules do.
"""

from __future__ import annotations

from .exceptions import MemPruneError

#: The top-level module a feature imports -> (the extra that installs it, the distribution's name).
EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("torch", "torch"),
    "torchvision": ("torch", "torchvision"),
    "stable_baselines3": ("rl", "stable-baselines3"),
    "sb3_contrib": ("rl", "sb3-contrib"),
    "gymnasium": ("rl", "gymnasium"),
    "ale_py": ("rl", "ale-py"),
    "cv2": ("rl", "opencv-python-headless"),
    "pynvml": ("gpu", "nvidia-ml-py"),
    "matplotlib": ("report", "matplotlib"),
    "rich": ("report", "rich"),
    "psycopg": ("postgres", "psycopg"),
    "optuna_dashboard": ("dashboard", "optuna-dashboard"),
    "ray": ("ray", "ray"),
}


class MissingExtra(MemPruneError, ImportError):
    """A call needs a module that an extra of the package installs and this install lacks; the message is
    one line naming the extra (``pip install "optuna-memprune[torch]"``).

    Examples:
        >>> print(MissingExtra.of(ModuleNotFoundError(name="torch"), "estimate.torch_training"))
        estimate.torch_training needs torch, which is not installed: pip install "optuna-memprune[torch]"
    """

    @classmethod
    def of(cls, exc: ImportError, what: str) -> MissingExtra | None:
        """The error to raise for ``exc`` (a failed import inside ``what``), or ``None`` where the module that
        failed to import belongs to no extra (a genuine error to raise as it is)."""
        top = (exc.name or "").split(".")[0]
        if top not in EXTRAS:
            return None
        extra, dist = EXTRAS[top]
        return cls(f'{what} needs {dist}, which is not installed: pip install "optuna-memprune[{extra}]"')
