"""The process's RSS as a guard's first trial in it finds it, for tests that set a budget just above it."""

from __future__ import annotations

import psutil

from optuna_memprune.guard._start import give_back


def start_rss() -> int:
    """The RSS after the give-back a guard's first trial starts with (garbage collected, glibc's heap
    trimmed): a budget set from the RSS before it, in a worker that ran other tests first, stood higher than
    the test meant (freed heap counted in it), and a trial meant to cross it did not."""
    give_back()
    return psutil.Process().memory_info().rss
