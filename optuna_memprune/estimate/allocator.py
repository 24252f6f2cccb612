"""Model of PyTorch's CUDA caching allocator, plus the fixed CUDA costs (context, cuBLAS workspace).

Owns the allocator's rules and replays timelines of byte sizes; must not know networks, traces or Optuna.

The rules are read from ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x, default configuration: no
``expandable_segments``, no ``max_split_size_mb``, no ``roundup_power2_divisions``, one stream, no
``empty_cache()``). Unit-tested against the rules as the source states them; checked on one H200 by
``scripts/gpu_check.py`` (docs/gpus.md: within 1.4% of ``max_memory_allocated`` at the median, reserved bytes
under where cuDNN workspaces open segments of their own).

Known limitations:
    - One stream. Cross-stream reuse (``record_stream``) and per-stream pools are not modelled.
    - Memory is unlimited: the out-of-memory path (free all cached blocks, retry) is not modelled, so on a
      nearly full device the real allocator may reserve *less* than predicted here, by releasing cache.
    - Allocations made outside the caching allocator (cuDNN/cuBLAS handles' own ``cudaMalloc``, NCCL,
      other libraries) are not in the timeline; cuDNN convolution workspaces, which *do* go through the
      allocator, are not visible to a meta trace either.
    - ``CUDA_CONTEXT_BYTES`` and ``CUBLAS_WORKSPACE_BYTES`` are defaults for hosts without a GPU: the context
      varies with driver, CUDA version, module loading and the GPU (758 MiB on an H200 with CUDA 13), and
      torchnet takes the figures the calibration's ``cuda`` probe measured where a GPU is visible.

Examples:
    >>> peaks = replay([(0, 3 * MiB), (1, 700), (0, -1), (2, 2 * MiB)])
    >>> peaks.peak_reserved >= peaks.peak_allocated
    True
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from typing import NamedTuple

from ..exceptions import EstimateError
from ..units import MiB

# --- Rules of c10/cuda/CUDACachingAllocator.cpp (constants keep the source's names in their comments) ---
MIN_BLOCK_SIZE = 512  # kMinBlockSize: every request is rounded up to a multiple of 512 B
SMALL_SIZE = 1 * MiB  # kSmallSize: largest request served from the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: small-pool segments are 2 MiB
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: requests in (1 MiB, 10 MiB) get a 20 MiB segment
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: requests >= 10 MiB get a segment of their own ...
ROUND_LARGE = 2 * MiB  # kRoundLarge: ... rounded up to a multiple of 2 MiB

# --- Fixed CUDA costs ---
# CUDA context of one process on one GPU. pytorch/pytorch#86509 measured ~274 MiB with lazy module loading
# (default since CUDA 12.2) vs 636 MiB eager; an H200 with CUDA 13 holds 758 MiB lazy (scripts/data/). The
# default where no GPU is visible; the calibration's cuda probe measures it where one is.
CUDA_CONTEXT_BYTES = 300 * MiB
# cuBLAS workspace, one per (handle, stream), allocated through the caching allocator at the first matmul
# and never freed. Default size from aten/src/ATen/cuda/CublasHandlePool.cpp: 4096 KiB * 2 + 16 KiB * 8 ...
# Hopper GPUs take more (65 MiB with cuBLASLt's on an H200, torch 2.11): measured where a GPU is visible.
CUBLAS_WORKSPACE_BYTES = 8_519_680


def round_size(nbytes: int) -> int:
    """Bytes the allocator hands out for a request: at least 512, rounded up to a multiple of 512."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def is_small(nbytes: int) -> bool:
    """True when a request of ``nbytes`` is served from the small pool (rounded size <= 1 MiB)."""
    return round_size(nbytes) <= SMALL_SIZE


def segment_size(nbytes: int) -> int:
    """Size of the new segment (one ``cudaMalloc``) opened when no cached block fits a request."""
    size = round_size(nbytes)
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class AllocatorPeaks(NamedTuple):
    """Result of a replay. All numbers are bytes, except ``segments`` (count of ``cudaMalloc`` calls)."""

    peak_allocated: int  # like torch.cuda.max_memory_allocated(): sizes of the blocks handed out
    peak_reserved: int  # like torch.cuda.max_memory_reserved(): sizes of all segments
    peak_requested: int  # the requests as asked, before rounding
    segments: int


class _Block:
    __slots__ = ("addr", "size", "small", "prev", "next", "allocated", "requested")

    def __init__(self, addr: int, size: int, small: bool) -> None:
        self.addr = addr
        self.size = size
        self.small = small
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.allocated = False
        self.requested = 0


class CachingAllocator:
    """One device's caching allocator, single stream, unlimited memory.

    ``malloc(nbytes)`` returns a block handle; ``free(block)`` returns it to the cache (memory stays
    reserved). Free blocks are found best-fit (smallest block that is large enough, lowest address on ties)
    in the pool of the request's size; a block larger than needed is split when the remainder is >= 512 B
    (small pool) or > 1 MiB (large pool); a freed block merges with free neighbours of its segment.
    """

    def __init__(self) -> None:
        # Free blocks per pool as sorted (size, addr) keys, the order of BlockComparatorSize.
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self._by_addr: dict[int, _Block] = {}
        self._next_addr = 0
        self.allocated = 0
        self.reserved = 0
        self.requested = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.peak_requested = 0
        self.segments = 0

    @staticmethod
    def should_split(block_size: int, size: int, small: bool) -> bool:
        """The source's ``should_split``: small pool keeps remainders >= 512 B, large pool > 1 MiB."""
        remaining = block_size - size
        return remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE

    def malloc(self, nbytes: int) -> _Block:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._free[small]
        i = bisect_left(pool, (size, -1))
        if i < len(pool):
            _, addr = pool.pop(i)
            block = self._by_addr[addr]
        else:
            seg = segment_size(nbytes)
            block = _Block(self._next_addr, seg, small)
            self._by_addr[block.addr] = block
            self._next_addr += seg
            self.reserved += seg
            self.segments += 1
            if self.reserved > self.peak_reserved:
                self.peak_reserved = self.reserved
        if self.should_split(block.size, size, small):
            rest = _Block(block.addr + size, block.size - size, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._by_addr[rest.addr] = rest
            insort(pool, (rest.size, rest.addr))
        block.allocated = True
        block.requested = nbytes
        self.allocated += block.size
        self.requested += nbytes
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        if self.requested > self.peak_requested:
            self.peak_requested = self.requested
        return block

    def free(self, block: _Block) -> None:
        if not block.allocated:
            raise EstimateError(f"block at {block.addr} is already free.")
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        pool = self._free[block.small]
        for other in (block.prev, block.next):
            if other is not None and not other.allocated:
                del pool[bisect_left(pool, (other.size, other.addr))]
                del self._by_addr[other.addr]
                if other is block.prev:
                    block.addr = other.addr
                    block.prev = other.prev
                    if other.prev is not None:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
                block.size += other.size
        self._by_addr[block.addr] = block
        insort(pool, (block.size, block.addr))

    def peaks(self) -> AllocatorPeaks:
        return AllocatorPeaks(self.peak_allocated, self.peak_reserved, self.peak_requested, self.segments)


def replay(events: Iterable[tuple[int, int]], *, allocator: CachingAllocator | None = None) -> AllocatorPeaks:
    """Replay a timeline through the allocator model and return its peaks.

    Args:
        events: ``(handle, nbytes)`` pairs in time order. ``nbytes >= 0`` allocates ``nbytes`` under the
            caller's ``handle`` (any hashable); ``nbytes < 0`` frees the block allocated under ``handle``.
            Zero-byte requests allocate nothing (CUDA returns a null pointer for them).
        allocator: continue from this allocator's state (e.g. after a persistent prologue); a fresh one by
            default.
    """
    alloc = CachingAllocator() if allocator is None else allocator
    live: dict[int, _Block] = {}
    malloc, free = alloc.malloc, alloc.free
    for handle, nbytes in events:
        if nbytes > 0:
            live[handle] = malloc(nbytes)
        elif nbytes < 0:
            block = live.pop(handle, None)
            if block is not None:
                free(block)
    return alloc.peaks()
