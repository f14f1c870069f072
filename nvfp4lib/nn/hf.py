"""Hugging Face models as clients of :class:`~nvfp4lib.nn.NVFP4MoE` (needs ``transformers``, the ``hf`` extra).

:func:`swap_moe_blocks` replaces every sparse MoE block of a Mixtral or Qwen3-MoE model, in place, with
:class:`NVFP4SparseMoeBlock`: the block's own router module kept as it is (so routing, Qwen3's ``norm_topk_prob``
and the router-logit recording of ``output_router_logits`` stay exactly the model's), its experts quantized to NVFP4.

Written against the transformers 5 layout (checked on 5.24): the router is a module returning ``(logits, top-k
weights, top-k ids)`` and the experts hold fused ``gate_up_proj [E, 2I, H]`` (gate rows first) and ``down_proj
[E, H, I]`` parameters. The transformers 4 layout (an ``nn.Linear`` router, one MLP module per expert, a block that
returns ``(hidden, router_logits)``) is refused with a message rather than guessed at.
"""
from __future__ import annotations

import torch

from .moe import NVFP4MoE

__all__ = ["swap_moe_blocks", "NVFP4SparseMoeBlock", "moe_block_classes", "tiny_model", "TINY"]


# A model small enough for a test or a demo, randomly initialised (nothing downloaded): two layers of 8 experts, top-2
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, num_experts_per_tok=2, max_position_embeddings=64)


def tiny_model(arch: str, **config) -> torch.nn.Module:
    """A randomly initialised ``"mixtral"`` or ``"qwen3_moe"`` causal LM of :data:`TINY`'s size (``config``
    overrides its fields), on the CPU in fp32: the architecture's code path with nothing to download."""
    import transformers

    if arch == "mixtral":
        return transformers.MixtralForCausalLM(transformers.MixtralConfig(**{"num_local_experts": 8, **TINY,
                                                                             **config}))
    if arch == "qwen3_moe":
        return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**{
            "num_experts": 8, "moe_intermediate_size": 32, "head_dim": 16, "norm_topk_prob": True, **TINY, **config}))
    raise ValueError(f"tiny_model: arch must be 'mixtral' or 'qwen3_moe', got {arch!r}")


def moe_block_classes() -> tuple[type, ...]:
    """The sparse MoE block classes of the installed transformers that :func:`swap_moe_blocks` replaces."""
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    return (MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock)


def _expert_weights(block) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    experts = block.experts
    if not (hasattr(experts, "gate_up_proj") and hasattr(experts, "down_proj")):
        import transformers

        raise TypeError(f"{type(block).__name__} holds its experts as {type(experts).__name__} without fused "
                        f"gate_up_proj/down_proj parameters (transformers {transformers.__version__}); swap_moe_blocks "
                        "supports the transformers 5 layout")
    act = type(getattr(experts, "act_fn", None)).__name__
    if act not in ("SiLU", "SiLUActivation"):
        raise ValueError(f"{type(block).__name__} uses activation {act}; NVFP4MoE computes silu(gate)·up")
    gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
    inter = gate_up.shape[1] // 2
    # the experts' forward splits with .chunk(2, dim=-1) on the output: gate is the first half of the rows
    return gate_up[:, :inter], gate_up[:, inter:], down


class NVFP4SparseMoeBlock(torch.nn.Module):
    """A sparse MoE block with NVFP4 experts: ``gate`` is the original block's router, ``moe`` the experts."""

    def __init__(self, gate: torch.nn.Module, moe: NVFP4MoE):
        super().__init__()
        self.gate, self.moe = gate, moe

    @classmethod
    def from_block(cls, block, *, activations: str = "nvfp4", backend: str = "cute-hopper") -> "NVFP4SparseMoeBlock":
        return cls(block.gate, NVFP4MoE.from_float(*_expert_weights(block), activations=activations, backend=backend))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        routed = self.gate(x)
        if not (isinstance(routed, tuple) and len(routed) == 3):
            raise TypeError(f"the router {type(self.gate).__name__} returned {type(routed).__name__}; expected the "
                            "transformers 5 (logits, top-k weights, top-k ids)")
        _, topk_weights, topk_ids = routed
        # Mixtral's router_jitter_noise only acts in training; this block is for inference and leaves it out.
        return self.moe(x, topk_ids, topk_weights).reshape(shape)


def swap_moe_blocks(model: torch.nn.Module, *, activations: str = "nvfp4", backend: str = "cute-hopper") -> int:
    """Replace, in place, every Mixtral / Qwen3-MoE sparse MoE block of ``model`` with an
    :class:`NVFP4SparseMoeBlock` built from that block's weights (quantized where they live: move the model to its
    device first). Returns how many blocks were swapped; raises ValueError if there were none."""
    classes = moe_block_classes()
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, classes)]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no {' or '.join(c.__name__ for c in classes)} to swap")
    for name, block in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, NVFP4SparseMoeBlock.from_block(block, activations=activations, backend=backend))
    return len(targets)
