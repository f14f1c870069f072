"""How the NVFP4 modules appear to ``torch.compile``: each forward as one opaque custom op.

Under ``torch.compile`` :class:`~.moe.NVFP4MoE` and :class:`~.linear.NVFP4Linear` call ``nvfp4lib::moe`` and
``nvfp4lib::linear``, whose bodies are the modules' eager forwards. Dynamo records one node per call (no graph break,
``fullgraph=True`` holds) and Inductor fuses what lies around it (a model's norms, rotary embeddings and router);
inside, the step runs exactly what it runs eagerly or in a CUDA graph: the one-launch Triton routing and quantizer and
the serving kernel. Traced instead (:data:`OPAQUE` False), the forward takes its torch forms (routing and quantizer as
torch ops that Inductor compiles: the same numbers, other kernels), as it did before this module existed.

The ops have no backward: where autograd records (grad enabled and an input requiring grad, as a router's weights
do outside ``torch.no_grad()``), the forward is traced as with :data:`OPAQUE` off. A module is named in the op by an
integer handle (:func:`handle`), held weakly: the op's schema takes tensors and numbers, not modules.

Prediction (2026-11-28, before a GPU run; the 48-layer Qwen3-30B-A3B shape at batch 1, graphed): compiled, the bf16
peer decodes at ~6.8 ms per token, ~140 µs per layer; the NVFP4 W4A4 model keeps its eager MoE (~42 µs a layer against
the peer's ~71) and its four projections (~35-45 µs against ~32 in bf16), so ~5.6-6.0 ms per token: 1.1-1.2x the
compiled peer. Traced, the step would run the torch routing and quantizer instead, compiled.

Outcome (H100, one generate-bench run, data/generate.jsonl; notebook 12 computes it): below the prediction, the
compiled NVFP4 model a little slower than the compiled peer at batch 1 (faster at batch 32). Why, from the compiled
step's profile (notebook 12): Inductor removed most elementwise kernels from both models alike, the peer's grouped
GEMM took as long as plain (so the guess that compiling also sped the peer's expert layer up did not hold), and at one
token the NVFP4 kernels (serving kernel and Triton routing and quantizers) took longer than the bf16 GEMMs they
replace. W4A4's greedy tokens moved from the plain loop's (Inductor
rounds the fused norms once, in fp32; W4A4 turns a one-ulp change into other codes; generate's exact_casts is the
knob for that). Kept as the shipped form: the one measured, and the eager kernels' exactness; the traced form's A/B
is next.
"""
from __future__ import annotations

import itertools
import weakref

import torch

__all__ = ["OPAQUE", "handle", "opaque", "moe", "linear"]

# Whether torch.compile sees the modules as the opaque ops (True) or traces their forwards (False): the A/B knob.
OPAQUE = True

_MODULES: dict[int, weakref.ref] = {}
_NEXT = itertools.count(1)


def handle(module: torch.nn.Module) -> int:
    """A new handle naming ``module`` (a module takes one when it is built; dropped when it is collected)."""
    h = next(_NEXT)
    _MODULES[h] = weakref.ref(module)
    weakref.finalize(module, _MODULES.pop, h, None)
    return h


def opaque(*inputs: torch.Tensor) -> bool:
    """Whether a forward on ``inputs`` traced by torch.compile is the opaque op (see the module doc)."""
    return OPAQUE and not (torch.is_grad_enabled() and any(t.requires_grad for t in inputs))


def _module(h: int) -> torch.nn.Module:
    ref = _MODULES.get(h)
    m = None if ref is None else ref()
    if m is None:
        raise RuntimeError(f"nvfp4lib: the module of handle {h} no longer exists (a compiled graph outlived its model)")
    return m


@torch.library.custom_op("nvfp4lib::moe", mutates_args=())
def moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, h: int) -> torch.Tensor:
    """:meth:`NVFP4MoE.forward <nvfp4lib.nn.NVFP4MoE.forward>` of the module with handle ``h``, run eagerly."""
    return _module(h).forward(x, topk_ids, topk_weights)


@moe.register_fake
def _(x, topk_ids, topk_weights, h):
    return x.new_empty(x.shape)


@torch.library.custom_op("nvfp4lib::linear", mutates_args=())
def linear(x: torch.Tensor, h: int) -> torch.Tensor:
    """:meth:`NVFP4Linear.forward <nvfp4lib.nn.NVFP4Linear.forward>` of the module with handle ``h``, run eagerly."""
    return _module(h).forward(x)


@linear.register_fake
def _(x, h):
    return x.new_empty((*x.shape[:-1], _module(h).out_features))
