"""``memprune run``'s parallel jobs: ``Study.optimize(..., n_jobs=k)`` (or ``--workers k``) in the guarded
program turned into one process per trial, k at a time, through the process-per-trial runner.

Design: threads of one process cannot have per-trial budgets, so the hook hands such a call to
``runner.optimize``: each trial in its own process with the whole budget, reserved on the host's ledger, on a
storage other processes can open (the study's own; for an in-memory study a journal file made here, whose
trials are copied back into the program's study when the call returns, so that what the program does next
with its study, rl-zoo3's report and pickle, sees them). The objective crosses into the trial's process by
cloudpickle (a bound method such as rl-zoo3's ``ExperimentManager.objective`` with its local env wrappers,
a function of the program's ``__main__``, a library's local function such as Hugging Face's), checked by a
round trip before the first trial. A trial's process never imports the program's main module (the runner's
fork server leaves it out for an objective that says ``needs_main_module = False``): a script without
``if __name__ == "__main__":``, whose study a library may create where no reading of its text could see it,
is run once. So nothing sent to the trial may name ``__main__`` (plain pickle's way with a main function,
a sampler or pruner class of the script): the round trip refuses such a name. Where the objective, the
sampler or the pruner cannot be sent, the trials run as the program asked, threads of its process, with
whole-process admission: a trial starts only when its prediction and those of the running trials fit under
the soft line together.

Owns the choice between the two, the objective's transport, the journal file and the admission gate;
knows nothing of the command line and never prints (the hook says what was done, in the words returned).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _internals
from ..guard.backend import policy_of, rss, trials_of
from ..records import Decision
from ..units import format_bytes


def jobs(n_jobs: Any, workers: int) -> int:
    """How many trials run at once: ``--workers`` where it is above 1, else Optuna's ``n_jobs`` (-1: the
    CPU count), at least 1.

    Examples:
        >>> jobs(1, 3), jobs(2, 1), jobs(1, 1)
        (3, 2, 1)
    """
    if workers > 1:
        return workers
    if not isinstance(n_jobs, int) or isinstance(n_jobs, bool):
        return 1
    return (os.cpu_count() or 1) if n_jobs == -1 else max(1, n_jobs)


class Transported:
    """The objective as it crosses into a trial's process: cloudpickle's bytes, and the torch thread count
    the program set (a trial's process starts from a fresh interpreter, whose default is the CPU count).
    It names nothing of ``__main__``, so the trial's process need not import the program's main module.

    ``spool`` puts the bytes in a file that every trial's process on this host reads instead (the local
    runner): an objective that holds the program's data (a 305 MiB array of a script's top level) then
    crosses as a path, not as a copy of the data per trial through the fork server's pipe, and is read into
    the trial's memory once, not beside a second copy of its bytes. Such a script's trials peaked at 710-744
    MiB under ``memprune run`` with bytes sent, 402-640 read from the file (docs/memprune-run.md)."""

    needs_main_module = False

    def __init__(self, data: bytes, torch_threads: int | None, by: str = "cloudpickle") -> None:
        self.data: bytes | None = data
        self.torch_threads, self.by = torch_threads, by
        self.path: str | None = None
        self._objective: Callable[[Any], Any] | None = None

    def __call__(self, trial: Any) -> Any:
        if self._objective is None:
            if self.torch_threads is not None:
                import torch

                torch.set_num_threads(self.torch_threads)
            if self.path is not None:
                with open(self.path, "rb") as f:  # read into the objective's buffers, no copy of its bytes
                    self._objective = pickle.load(f)
            else:
                self._objective = pickle.loads(self.data or b"")
            self.data = None
        return self._objective(trial)

    def spool(self) -> None:
        """Keep the bytes in a new temporary file (readable by this user only), not in memory."""
        if self.data is None:
            return
        fd, path = tempfile.mkstemp(prefix="memprune-objective-", suffix=".pkl")
        with os.fdopen(fd, "wb") as f:
            f.write(self.data)
        self.path, self.data = path, None

    def unspool(self) -> None:
        """Remove the file ``spool`` wrote (the trials that read it have ended)."""
        if self.path is not None:
            Path(self.path).unlink(missing_ok=True)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_objective": None}


def transport(objective: Callable[[Any], Any]) -> Transported:
    """``objective`` made to cross into another process (cloudpickle, or pickle where cloudpickle is not
    installed; checked by a round trip); the exception saying why it cannot (what pickling raised)."""
    import sys

    try:
        import cloudpickle
    except ImportError:  # pickle alone: a module-level function or a picklable callable object
        cloudpickle = None
    data = (cloudpickle or pickle).dumps(objective)
    _NoMain(io.BytesIO(data)).load()
    torch = sys.modules.get("torch")
    moved = Transported(
        data, torch.get_num_threads() if torch is not None else None, "pickle" if cloudpickle is None else "cloudpickle"
    )
    module = getattr(objective, "__module__", None)
    if isinstance(module, str) and module != "__main__":
        moved.__module__ = module  # the runner's fork server imports it once, not every trial's process
    return moved


def unsendable(obj: Any, what: str) -> str | None:
    """Why ``obj`` (the program's sampler or pruner) cannot be sent to a trial's process as it is (plain
    pickle, as the runner sends it): it does not pickle, or it names the program's main module; else None."""
    try:
        _NoMain(io.BytesIO(pickle.dumps(obj))).load()
    except Exception as exc:  # noqa: BLE001 - any failure means it cannot be sent
        return f"the study's {what} cannot be sent to another process: {type(exc).__name__}: {str(exc)[:200]}"
    return None


class _NoMain(pickle.Unpickler):
    """An unpickler that refuses the main module's names: a trial's process does not import ``__main__``."""

    def find_class(self, module: str, name: str) -> Any:
        if module in ("__main__", "__mp_main__"):
            raise pickle.UnpicklingError(
                f"{name} is named in the program's main module, which a trial's process does not import"
            )
        return super().find_class(module, name)


@dataclass
class Shared:
    """The study the runner uses: the program's own, or a copy on a journal file for an in-memory study
    (``path`` set; ``before``: how many trials the copy started with)."""

    study: Any
    path: Path | None = None
    before: int = 0


def shared_study(study: Any, directory: Path) -> Shared:
    """``study`` if other processes can open its storage, else a copy of it on a new journal file in
    ``directory`` (its finished trials carried over, the same sampler and pruner)."""
    import optuna

    storage = _internals.storage_of(study)
    if not isinstance(storage, optuna.storages.InMemoryStorage):
        return Shared(study)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", study.study_name)[:80] or "study"
    path = directory / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    from optuna.storages.journal import JournalFileBackend

    journal = optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    journal.create_new_study(list(study.directions), study.study_name)
    copy = optuna.Study(study.study_name, journal, sampler=study.sampler, pruner=study.pruner)
    finished = [t for t in study.get_trials(deepcopy=True) if t.state.is_finished()]
    if finished:
        copy.add_trials(finished)
    return Shared(copy, path, len(finished))


def copy_back(shared: Shared, study: Any) -> int:
    """The trials the runner added to a journal copy, added to the program's in-memory ``study``; how many."""
    if shared.path is None:
        return 0
    new = [t for t in shared.study.get_trials(deepcopy=True)[shared.before :] if t.state.is_finished()]
    if new:
        study.add_trials(new)
    return len(new)


class Gate:
    """Whole-process admission for trials run as threads of one process: a trial waits until its predicted
    RAM and that of the trials running fit under ``line`` together (a trial runs alone when nothing runs);
    an unchecked trial counts as the whole line, a rejected one passes through to be ended. A learned
    footprint predicts a trial's own increment: there the process's RSS when the first of the running trials
    started counts too."""

    def __init__(self, objective: Callable[[Any], Any], guard: Any, line: int) -> None:
        self._objective, self._guard, self._line = objective, guard, line
        self._cond = threading.Condition()
        self._held = 0
        self._base = 0  # the process's RSS when nothing ran, where predictions are increments

    def __call__(self, trial: Any) -> Any:
        _ = trial.relative_params  # Optuna samples at the first suggest: the guarded sampler checks the trial here
        state = trials_of(self._guard).get(_internals.trial_id(trial))
        if state is not None and state.decision is Decision.REJECTED:
            return self._objective(trial)
        need = self._line
        if state is not None and state.checked and state.prediction is not None and state.prediction.ram:
            need = min(int(state.prediction.ram), self._line)
        with self._cond:
            if not self._held and policy_of(self._guard).increments:
                self._base = rss() or 0
            while self._held and self._base + self._held + need > self._line:
                self._cond.wait()
            self._held += need
        try:
            return self._objective(trial)
        finally:
            with self._cond:
                self._held -= need
                self._cond.notify_all()


def whole_process_words(k: int, why: str, line: int) -> str:
    """The line that says trials run as threads under whole-process admission, and why."""
    return (
        f"{k} jobs run as threads of this process ({why}), with whole-process admission: a trial starts "
        f"only when its prediction and those of the running trials fit under {format_bytes(line)} together"
    )
