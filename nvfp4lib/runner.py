"""The prepared-call contract the study's harness times: ``Runner``.

A study backend (a kernel config of the study, a peer) is a factory ``prepare(a, b, b2, *, out_dtype, **options) ->
Runner``: ``prepare`` does the one-time work (dequantizing or packing weights, compiling), and calling the runner does
the per-call work and writes ``runner.outputs``. Kernel families that the study benchmarks return one; the registry of
named backends is :mod:`nvfp4lib.bench.backends`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["Runner"]


@dataclass
class Runner:
    """A prepared grouped GEMM: ``runner()`` launches it and returns ``runner.outputs``."""

    fn: Callable[[], None]
    outputs: list[torch.Tensor]
    prepare_s: float = 0.0
    held_bytes: int = 0  # device memory the backend holds for the weights (NVFP4: 0.5625 B/elem)
    notes: str = ""
    info: dict = field(default_factory=dict)
    # Where the backend's own result rounding exceeds the fp16 check (e.g. a bf16-only result), the
    # tolerance it is checked against; recorded beside every measurement.
    tolerance: float | None = None
    # Why the per-call work cannot be captured in a CUDA graph, if it cannot.
    not_graphable: str = ""
    # Whatever the launch needs alive (a graph replays raw addresses: the tensors behind them must outlive it).
    keepalive: object = None

    def __call__(self) -> list[torch.Tensor]:
        self.fn()
        return self.outputs

    def poison(self, value: float = float("nan")) -> None:
        for o in self.outputs:
            o.fill_(value)
