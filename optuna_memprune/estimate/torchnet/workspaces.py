"""Kernel workspaces of CPU targets: the rules and features of memory a kernel allocates without dispatching.

Owns ``WORKSPACE_RULES``, ``channel_block`` and ``workspace_features`` (read by the tracer's counter and by the
calibration's kernel probe, so probe and estimator cannot drift apart); knows nothing of the rest of the tracer,
of calibration or of footprints: it imports torch only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["WORKSPACE_RULES", "channel_block", "workspace_features"]

# Found by logging malloc/free around each dispatched op of real CPU training steps (torch 2.13, oneDNN 3.12):
# only oneDNN convolutions (torch's default CPU backend for floating-point conv) allocate large buffers
# inside an op. oneDNN computes on blocked layouts (nChw16c on AVX-512, nChw8c on AVX2: oneDNN's
# "Understanding Memory Formats"), so it reorders plain operands into buffers with the channels padded to the
# block, and back: forward the output (and often the input), backward the output gradient and the input (for
# the weight gradient) and the input gradient. All are freed before the op returns. Linear layers (MKL
# GEMM), pooling, activations and the optimizers allocated nothing large outside the dispatcher.
# A rule is one feature of an op: the bytes of one operand with its channels padded. The bytes a kernel
# allocates are the sum of coefficient x feature over the op's rules; the coefficients are measured on this
# host by ``calibration.Calibration.cpu_kernels`` on reference convolutions.
WORKSPACE_RULES = ("conv_fwd_in", "conv_fwd_out", "conv_bwd_in", "conv_bwd_out", "conv_bwd_grad_in")
_WS_FWD_IN, _WS_FWD_OUT, _WS_BWD_IN, _WS_BWD_OUT, _WS_BWD_GRAD_IN = range(len(WORKSPACE_RULES))
# Operands with at most this many channels are padded to it rather than to the block (measured: a 4-channel
# input's weight-gradient reorder is twice the input on AVX-512, not four times).
_SMALL_CHANNELS = 8
_CONV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def channel_block() -> int:
    """Channels per block of oneDNN's blocked layouts on this CPU: 16 with AVX-512 (or AMX), else 8."""
    cap = str(torch.backends.cpu.get_cpu_capability()).upper()
    return 16 if ("AVX512" in cap or "AMX" in cap) else 8


def _padded_bytes(t: Any, block: int) -> int:
    """Bytes of ``t`` (N, C, *spatial) in a blocked layout: C rounded up to the block."""
    c: int = t.shape[1]
    unit = _SMALL_CHANNELS if c <= _SMALL_CHANNELS else block
    padded = -(-c // unit) * unit
    elements: int = t.numel()
    itemsize: int = t.element_size()
    return elements // max(c, 1) * padded * itemsize


def workspace_features(
    func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], out: Any, block: int
) -> list[tuple[int, int]]:
    """``(rule, feature bytes)`` of the kernel workspaces a CPU op allocates outside the dispatcher.

    ``rule`` indexes ``WORKSPACE_RULES``; ``block`` is ``channel_block()``. Only convolutions (1-3 spatial
    dims, floating point) have rules; everything else returns ``[]``.
    """
    if func is torch.ops.aten.convolution.default:
        x = args[0]
        if x.dim() < 3 or x.dtype not in _CONV_DTYPES or not isinstance(out, torch.Tensor):
            return []
        features = [(_WS_FWD_OUT, _padded_bytes(out, block))]
        if x.shape[1] >= block:  # oneDNN's first-layer kernels read a plain input with few channels
            features.append((_WS_FWD_IN, _padded_bytes(x, block)))
        return features
    if func is torch.ops.aten.convolution_backward.default:
        grad_out, x = args[0], args[1]
        if x.dim() < 3 or x.dtype not in _CONV_DTYPES:
            return []
        features = [(_WS_BWD_IN, _padded_bytes(x, block)), (_WS_BWD_OUT, _padded_bytes(grad_out, block))]
        mask = args[10] if len(args) > 10 else kwargs.get("output_mask", (True,))
        if mask[0]:  # the input gradient is computed
            features.append((_WS_BWD_GRAD_IN, _padded_bytes(x, block)))
        return features
    return []
