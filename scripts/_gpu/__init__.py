"""The GPU check kit behind ``scripts/gpu_check.py``: what is checked, how it is scored, and the CUDA side.

``rows`` (which models, batches, optimizers; the predictions) and ``results`` (error arithmetic, summary
lines, JSON) run anywhere; ``isolate`` runs one check in its own process under a time limit; ``worker`` is
that process's entry (``python -m _gpu.worker``), dispatching to ``cuda_checks`` and ``guard_checks``, the
only modules here that need a CUDA device.
"""
