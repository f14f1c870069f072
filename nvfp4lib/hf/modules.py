"""What a loaded model's expert modules become: :class:`NVFP4Experts`, a transformers 5 experts module on
:class:`~nvfp4lib.nn.NVFP4MoE` (or on any expert layer with the same ``forward(x, topk_ids, topk_weights)``, such as
the benchmark's bf16 peer); and :func:`set_module_tensor`, which puts a module, parameter or buffer at a dotted name.

transformers 5's MoE blocks (Qwen3-MoE, Mixtral, DeepSeek-V3) call ``experts(hidden [T, H], top_k_index [T, k],
top_k_weights [T, k])`` after their own router; replacing only the experts module keeps each block's routing, shared
experts and reshapes exactly the model's code.
"""
from __future__ import annotations

import torch

from ..nn.moe import NVFP4MoE

__all__ = ["NVFP4Experts", "set_module_tensor"]


class NVFP4Experts(torch.nn.Module):
    def __init__(self, moe: NVFP4MoE | torch.nn.Module):
        super().__init__()
        self.moe = moe
        self.num_experts = moe.experts

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return self.moe(hidden_states, top_k_index, top_k_weights)


def set_module_tensor(model: torch.nn.Module, name: str, value) -> None:
    """Put ``value`` (a module, or a tensor as the parameter or buffer it replaces) at the dotted ``name``."""
    parent, _, leaf = name.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    if isinstance(value, torch.nn.Module):
        setattr(owner, leaf, value)
    elif leaf in owner._parameters:
        owner._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[leaf] = value
