"""The architectures :func:`nvfp4lib.hf.from_pretrained` loads, and how their checkpoints name things.

Checkpoints (and both exporters) keep the original per-expert names; transformers 5 holds each layer's experts fused
(``gate_up_proj [E, 2I, H]``, gate rows first, and ``down_proj [E, H, I]``) in one ``experts`` module. An
:class:`Arch` translates a checkpoint module name to the model's and names each expert projection's role:

- Qwen3-MoE, DeepSeek-V3: ``model.layers.L.mlp.experts.E.{gate_proj, up_proj, down_proj}`` (DeepSeek-V3 also has
  ``mlp.shared_experts.*`` and dense first layers: plain Linears);
- Mixtral: ``model.layers.L.block_sparse_moe.experts.E.{w1 (gate), w3 (up), w2 (down)}``, the block named ``mlp`` in
  transformers 5 (``block_sparse_moe.gate`` is the router).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Arch", "ARCHS", "arch_of", "EXPERT_RE"]

# a checkpoint module of one expert's projection: (experts module, expert index, projection)
EXPERT_RE = re.compile(r"^(?P<experts>.+\.experts)\.(?P<e>\d+)\.(?P<proj>[A-Za-z0-9_]+)$")


@dataclass(frozen=True)
class Arch:
    model_type: str
    roles: dict  # checkpoint projection name -> "gate" | "up" | "down"
    block: str = "mlp"  # the MoE block's name in checkpoints (what make_checkpoint writes)
    renames: tuple[tuple[str, str], ...] = ()  # checkpoint substring -> model substring

    def to_model(self, name: str) -> str:
        for a, b in self.renames:
            name = name.replace(a, b)
        return name

    def to_checkpoint(self, name: str) -> str:
        for a, b in self.renames:
            name = name.replace(b, a)
        return name

    def proj(self, role: str) -> str:
        """The checkpoint name of an expert projection's role."""
        return next(p for p, r in self.roles.items() if r == role)


_SWIGLU = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
ARCHS = {
    "qwen3_moe": Arch("qwen3_moe", _SWIGLU),
    "mixtral": Arch("mixtral", {"w1": "gate", "w3": "up", "w2": "down"}, "block_sparse_moe",
                    ((".block_sparse_moe.", ".mlp."),)),
    "deepseek_v3": Arch("deepseek_v3", _SWIGLU),
}


def arch_of(config: dict, source: str = "config.json") -> Arch:
    mt = config.get("model_type")
    if mt not in ARCHS:
        from .checkpoint import CheckpointError

        raise CheckpointError(f"{source}: model_type {mt!r} is not supported; nvfp4lib.hf loads "
                              f"{', '.join(ARCHS)}")
    return ARCHS[mt]
