"""The backend contract: how an implementation of the grouped GEMM plugs into nvfp4lib.

A backend is a *factory* ``prepare(a, b, b2, *, out_dtype, **options) -> Runner``.
``a``, ``b`` (and ``b2`` for the fused dual GEMM, else ``None``) are lists of
:class:`nvfp4lib.formats.NVFP4Tensor`, one per group, already validated by
:mod:`nvfp4lib.api` (same device, matching K, K % 16 == 0, ...).

``prepare`` does the one-time work a real deployment does once per weight set
(dequantizing weights ahead of time, stacking/prepacking them, compiling) and
returns a :class:`Runner`.  Calling the runner does the per-call work (activations
change every call) and writes into ``runner.outputs``; the benchmark times only
the call, and reports ``prepare_s`` and ``held_bytes`` beside it.

Backends are registered by name in :data:`BACKENDS` as ``"module:function"``
strings so that importing nvfp4lib never imports CuTe DSL or Triton.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import torch

__all__ = ["Runner", "BACKENDS", "get_backend", "available_backends"]


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


BACKENDS: dict[str, str] = {
    "reference": "nvfp4lib.reference:prepare",
    "cute-hopper": "nvfp4lib.kernels.hopper_smem.kernel:prepare",
    "cute-blackwell": "nvfp4lib.kernels.blackwell.runner:prepare",  # compiled for sm_100a, not run
    "torch-bf16": "nvfp4lib.peers.torch_peers:prepare_bf16",
    "torch-grouped-mm": "nvfp4lib.peers.torch_peers:prepare_grouped_mm",
    "torch-bf16-predequant": "nvfp4lib.peers.torch_peers:prepare_bf16_predequant",
    "torch-grouped-mm-fused": "nvfp4lib.peers.torch_peers:prepare_grouped_mm_fused",
    "torch-dequant": "nvfp4lib.peers.torch_peers:prepare_dequant",
    "torch-compile": "nvfp4lib.peers.torch_peers:prepare_compile",
    "triton": "nvfp4lib.peers.triton_nvfp4:prepare",
}


def available_backends() -> list[str]:
    return sorted(BACKENDS)


def get_backend(name: str) -> Callable[..., Runner]:
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known backends: {', '.join(available_backends())}")
    module, func = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), func)
