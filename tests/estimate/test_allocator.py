"""Tests of estimate/allocator.py against the rules of c10/cuda/CUDACachingAllocator.cpp as documented.

No GPU confirms these: they check that the model follows the stated rules, not that the rules are complete.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from optuna_memprune.units import MiB
from optuna_memprune.estimate import allocator
from optuna_memprune.estimate.allocator import CachingAllocator, replay


def test_constants_from_the_source():
    assert allocator.MIN_BLOCK_SIZE == 512
    assert allocator.SMALL_SIZE == 1 * MiB
    assert allocator.SMALL_BUFFER == 2 * MiB
    assert allocator.LARGE_BUFFER == 20 * MiB
    assert allocator.MIN_LARGE_ALLOC == 10 * MiB
    assert allocator.ROUND_LARGE == 2 * MiB
    assert allocator.CUBLAS_WORKSPACE_BYTES == 8_519_680 == 4096 * 1024 * 2 + 16 * 1024 * 8
    assert allocator.CUDA_CONTEXT_BYTES == 300 * MiB


@pytest.mark.parametrize(
    "request_, rounded", [(0, 512), (1, 512), (511, 512), (512, 512), (513, 1024), (1000, 1024), (MiB + 1, MiB + 512)]
)
def test_requests_round_up_to_512(request_, rounded):
    assert allocator.round_size(request_) == rounded


@pytest.mark.parametrize(
    "request_, small, segment",
    [
        (4, True, 2 * MiB),
        (MiB, True, 2 * MiB),  # <= 1 MiB: small pool, 2 MiB segments
        (MiB + 1, False, 20 * MiB),  # 1-10 MiB: 20 MiB segments
        (10 * MiB - 512, False, 20 * MiB),
        (10 * MiB, False, 10 * MiB),  # >= 10 MiB: own segment rounded to 2 MiB
        (10 * MiB + 1, False, 12 * MiB),
        (123 * MiB + 7, False, 124 * MiB),
    ],
)
def test_pool_and_segment_size(request_, small, segment):
    assert allocator.is_small(request_) is small
    assert allocator.segment_size(request_) == segment


def test_small_requests_pack_into_2mib_segments():
    a = CachingAllocator()
    blocks = [a.malloc(512 * 1024) for _ in range(4)]
    assert a.segments == 1 and a.reserved == 2 * MiB and a.allocated == 2 * MiB
    a.malloc(512)
    assert a.segments == 2 and a.reserved == 4 * MiB
    assert len(blocks) == 4


def test_freed_blocks_stay_reserved_and_are_reused():
    a = CachingAllocator()
    b = a.malloc(3 * MiB)
    a.free(b)
    assert a.allocated == 0 and a.reserved == 20 * MiB
    a.malloc(3 * MiB)
    assert a.segments == 1 and a.reserved == 20 * MiB


def test_large_pool_splits_only_when_remainder_exceeds_1mib():
    a = CachingAllocator()
    first = a.malloc(9 * MiB)  # 20 MiB segment, remainder 11 MiB > 1 MiB: split
    assert first.size == 9 * MiB
    a.malloc(9 * MiB)  # fits the 11 MiB remainder, remainder 2 MiB: split
    assert a.segments == 1
    third = a.malloc(1536 * 1024)  # 1.5 MiB fits the 2 MiB remainder; 0.5 MiB left: not split
    assert a.segments == 1 and third.size == 2 * MiB
    assert a.allocated == 20 * MiB  # allocated counts whole blocks, as the stats do
    b = CachingAllocator()
    big = b.malloc(11 * MiB)  # own 12 MiB segment, remainder exactly 1 MiB: not split
    assert big.size == 12 * MiB and b.allocated == 12 * MiB


def test_small_pool_splits_when_remainder_at_least_512():
    a = CachingAllocator()
    block = a.malloc(MiB)  # small segment 2 MiB, remainder 1 MiB >= 512: split
    rest = a.malloc(MiB - 512)  # fits the remainder; 512 B left, >= 512: split again
    last = a.malloc(1)  # takes the last 512 B
    assert a.segments == 1 and block.size == MiB and rest.size == MiB - 512 and last.size == 512


def test_best_fit_picks_the_smallest_block_that_fits():
    a = CachingAllocator()
    b12 = a.malloc(12 * MiB)
    b14 = a.malloc(14 * MiB)
    a.free(b14)
    a.free(b12)
    got = a.malloc(11 * MiB)  # both fit; best fit is the 12 MiB block
    assert got.addr == b12.addr and got.size == 12 * MiB
    got = a.malloc(13 * MiB)
    assert got.size == 14 * MiB and a.segments == 2 and a.reserved == 26 * MiB


def test_free_merges_neighbours_within_a_segment():
    a = CachingAllocator()
    blocks = [a.malloc(256 * 1024) for _ in range(8)]  # fills one 2 MiB small segment
    assert a.segments == 1
    for b in blocks[::2] + blocks[1::2]:
        a.free(b)
    whole = a.malloc(MiB)  # only possible in this segment if the blocks merged
    again = a.malloc(MiB)
    assert a.segments == 1 and whole.addr != again.addr


def test_double_free_is_an_error():
    a = CachingAllocator()
    b = a.malloc(100)
    a.free(b)
    with pytest.raises(ValueError):
        a.free(b)


def test_replay_handles_and_zero_byte_requests():
    peaks = replay([(0, 0), (1, 3 * MiB), (0, -1), (2, 700), (1, -1), (3, 3 * MiB), (99, -1)])
    assert peaks.segments == 2  # one large (20 MiB), one small (2 MiB); 0 B allocates nothing
    assert peaks.peak_reserved == 22 * MiB  # handle 3 reuses handle 1's freed block
    assert peaks.peak_allocated == 3 * MiB + 1024  # 700 B rounds to 1024
    assert peaks.peak_requested == 3 * MiB + 700


def test_replay_continues_an_allocator():
    a = CachingAllocator()
    a.malloc(allocator.CUBLAS_WORKSPACE_BYTES)  # 8.125 MiB: a 20 MiB segment with 11.875 MiB free
    peaks = replay([(0, 10 * MiB - 512)], allocator=a)
    assert peaks.segments == 1  # the request fits the workspace segment's remainder


@pytest.mark.parametrize("seed", range(5))
def test_peak_reserved_at_least_peak_allocated_on_random_timelines(seed):
    rng = random.Random(seed)
    events, live = [], []
    for h in range(400):
        if live and rng.random() < 0.45:
            events.append((live.pop(rng.randrange(len(live))), -1))
        else:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(4096, 2 * MiB), rng.randrange(2 * MiB, 40 * MiB)])
            events.append((h, size))
            live.append(h)
    peaks = replay(events)
    assert peaks.peak_reserved >= peaks.peak_allocated >= peaks.peak_requested > 0
    assert peaks.peak_reserved % (2 * MiB) == 0
    assert peaks.peak_allocated % 512 == 0


def test_module_imports_no_torch():
    code = "import sys, optuna_memprune.estimate.allocator; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.stdout.strip() == "False"
