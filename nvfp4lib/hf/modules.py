"""What a loaded model's expert modules become: :class:`NVFP4Experts`, a transformers 5 experts module on
:class:`~nvfp4lib.nn.NVFP4MoE`.

transformers 5's MoE blocks (Qwen3-MoE, Mixtral, DeepSeek-V3) call ``experts(hidden [T, H], top_k_index [T, k],
top_k_weights [T, k])`` after their own router; replacing only the experts module keeps each block's routing, shared
experts and reshapes exactly the model's code.
"""
from __future__ import annotations

import torch

from ..nn.moe import NVFP4MoE

__all__ = ["NVFP4Experts"]


class NVFP4Experts(torch.nn.Module):
    def __init__(self, moe: NVFP4MoE):
        super().__init__()
        self.moe = moe
        self.num_experts = moe.experts

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return self.moe(hidden_states, top_k_index, top_k_weights)
