"""The kernel's part in a trial's stop: which enforcement ``optimize(enforce=...)`` gets on this host, the
trial's cgroup made before its process starts, the kernel's verdict and exact peak after it ends, the
group killed and removed.

Runs in the runner's process; knows nothing of the study, the record's encoding (it builds the record's
``Enforcement`` value only) or the ledger. The group's files are ``cgroups``' (layer 0); the trial's
process joins its group itself (``_child``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import cgroups
from ..exceptions import EnforcementError
from ..records import Enforcement, EnforcementMode
from ..units import MiB

if TYPE_CHECKING:
    from ..budget import Budget

_logger = logging.getLogger("optuna_memprune.guard")

ENFORCE = ("auto", "cgroup", "polling")
POLLING = "polling"


def check_enforce(enforce: object) -> str:
    """``enforce`` as given, or ValueError naming it."""
    if not isinstance(enforce, str) or enforce not in ENFORCE:
        raise ValueError(
            f"enforce must be 'auto' (a cgroup per trial where one can be made, else polling), "
            f"'cgroup' (a cgroup per trial or an error) or 'polling', but got {enforce!r}."
        )
    return enforce


class Enforcer:
    """How this runner's trials are held to their RAM budget: a cgroup per trial (with the kernel's limit
    where the hierarchy has a memory controller) or polling alone. The watchdog polls in every mode.

    Raises:
        ValueError: ``enforce`` is not one of ``ENFORCE``.
        EnforcementError: (a RuntimeError) ``enforce="cgroup"`` where no group can be made here (the
            reason is in the message).
    """

    def __init__(self, enforce: str, budget: Budget, soft: float) -> None:
        self.enforce = check_enforce(enforce)
        self.hard = budget.ram
        self.high = None if budget.ram is None else int(budget.ram * soft)
        self.place: cgroups.Place | None = None
        self.reason = "enforce='polling'"
        if enforce == POLLING:
            return
        self.place, self.reason = cgroups.place()
        if self.place is None:
            if enforce == "cgroup":
                raise EnforcementError(
                    f"enforce='cgroup', but no cgroup can be made for the trials here: "
                    f"{self.reason}. Use enforce='auto' (polling where no group can be made) "
                    "or 'polling'."
                )
            _logger.info("Trials are watched by polling only: no cgroup can be made here (%s).", self.reason)
            return
        reaped = cgroups.reap(self.place)
        if reaped:
            _logger.info("Removed %d cgroup(s) left by dead runners: %s", len(reaped), ", ".join(reaped))

    def describe(self) -> str:
        """One line: what holds the trials to their RAM budget here."""
        if self.place is None:
            return f"trials are held to their RAM budget by polling ({self.reason})"
        what = (
            "the kernel's limit on a cgroup per trial"
            if self.place.memory and self.hard is not None
            else ("polling, with a cgroup per trial for the tree kill")
        )
        return f"trials are held to their RAM budget by {what} ({self.place.label} {self.place.name})"

    def open(self, number: int) -> TrialCgroup | None:
        """The cgroup of trial ``number``, limited, before its process starts; None for polling alone."""
        if self.place is None:
            return None
        group, reason = cgroups.TrialGroup.create(self.place, number)
        if group is None:
            _logger.warning("Trial %d is watched by polling only: %s", number, reason)
            return None
        hard = self.hard if group.memory else None
        try:
            if hard is not None:
                group.limit(hard, self.high if self.place.version == 2 else None)
        except OSError as exc:
            _logger.warning("Trial %d is watched by polling only: its cgroup's limit cannot be set (%s)", number, exc)
            group.remove()
            return None
        return TrialCgroup(group, hard, self.high)


class TrialCgroup:
    """One trial's group, seen from the runner."""

    def __init__(self, group: cgroups.TrialGroup, hard: int | None, high: int | None) -> None:
        self.group, self.hard = group, hard
        self.join = group.join_spec(hard, high)  # what the trial's process passes to cgroups.join

    def label(self) -> Enforcement:
        """The record's ``enforcement``: which one applied to the trial that ran."""
        if not self.group.ran():
            return Enforcement(EnforcementMode.POLLING, reason="no process of the trial ran in its cgroup")
        mode = EnforcementMode.CGROUP_LIMIT if self.hard is not None else EnforcementMode.CGROUP_TREE_KILL
        return Enforcement(mode, cgroup_version=self.group.place.version)

    def counts_oom_kills(self) -> bool:
        """Whether the group's OOM-kill count is exact for the trial: a memory controller, and the trial's
        process ran in it (the kernel counts a kill in the victim's group, at its limit or for the host)."""
        return self.hard is not None and self.group.ran()

    def verdict(self, peak_ram: int | None) -> tuple[int | None, str | None]:
        """After the trial's process tree ended (before ``remove``): the trial's peak RAM, the largest
        of the polled one and the group's exact peak plus what the process held when it joined, and the
        reason when the kernel killed in the group at its limit (else None).

        The group charges only what the trial allocated after joining (see ``cgroups.join``); the limit
        the trial set is ``hard - r0``, so ``r0`` is read back from it. The group's peak counts the page
        cache of the files the trial read or wrote too: what is still charged once its processes are gone
        is that cache, and is left out. A trial killed at the limit needed at least one page more than
        it: its peak is at least that."""
        if self.hard is None:
            return peak_ram, None
        limit, peak = self.group.hard_limit(), self.group.peak()
        r0 = self.hard - limit if limit is not None and limit <= self.hard else 0
        if peak is not None and self.group.ran():
            peak_ram = max(peak_ram or 0, peak + r0 - self.group.usage())
        if self.group.oom_kills() == 0:
            return peak_ram, None
        peak_ram = max(peak_ram or 0, self.hard + cgroups.PAGE)
        return peak_ram, f"stopped by the kernel at its cgroup limit ({self.hard / MiB:.0f} MiB)"

    def kill(self) -> None:
        """SIGKILL everything in the group: a grandchild whose parent died first is in it too."""
        self.group.kill()

    def remove(self) -> None:
        if not self.group.remove():
            _logger.warning("The trial's cgroup %s could not be removed (the next runner reaps it).", self.group.path)
