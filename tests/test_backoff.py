"""The retry schedule for a database server that cannot be reached: doubling spans, each wait drawn in the
upper half of its span, so that processes cut off at the same moment do not come back at the same moment."""

from __future__ import annotations

import itertools
import random
import statistics

from optuna_memprune._backoff import FIRST_S, LONGEST_S, waits


def test_each_wait_lies_in_the_upper_half_of_a_span_that_doubles_up_to_its_longest() -> None:
    for seed in range(50):
        got = list(itertools.islice(waits(random.Random(seed)), 12))
        spans = [min(FIRST_S * 2**n, LONGEST_S) for n in range(12)]
        assert all(s / 2 <= w <= s for w, s in zip(got, spans, strict=True)), (seed, got)


def test_processes_cut_off_together_come_back_apart() -> None:
    # 64 processes that lost the server at one moment: their fifth retries (about 2-3 s later, a restart's
    # length) spread over most of a second; without the draws they would all fall on the same instant.
    fifth = [sum(itertools.islice(waits(random.Random(seed)), 5)) for seed in range(64)]
    assert max(fifth) - min(fifth) > 0.8 and statistics.pstdev(fifth) > 0.15
    assert 1.55 <= min(fifth) and max(fifth) <= 3.1  # the spans' halves summed, and the spans summed
