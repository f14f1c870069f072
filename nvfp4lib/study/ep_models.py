"""Published configs of the MoE models that NVFP4 expert parallelism is for (notebook 13's table of which fit on how
many GPUs): the numbers of each model's ``config.json`` that its weight bytes depend on, each naming its source.

Parameter counts (:meth:`ModelConfig.params`) are computed from these numbers: routed experts, shared experts, dense
MLP layers, attention (grouped-query, or DeepSeek's multi-head latent attention), norms, routers, embeddings and the
LM head. DeepSeek-V3's multi-token-prediction module (``num_nextn_predict_layers``: 1, about 14 B parameters more in
the checkpoint) serves only speculative decoding and is not counted, as the model's stated 671 B does not count it.
``published_b`` is each model card's total, which the computed count is checked against (tests/test_ep_report.py).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelConfig", "MODELS", "get_model"]


@dataclass(frozen=True)
class ModelConfig:
    name: str
    source: str  # the config.json the numbers are read from
    hidden: int  # hidden_size
    layers: int  # num_hidden_layers
    experts: int  # routed experts per MoE layer (n_routed_experts / num_experts / num_local_experts)
    top_k: int  # num_experts_per_tok
    moe_intermediate: int  # one routed expert's intermediate (moe_intermediate_size; Mixtral: intermediate_size)
    vocab: int
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int  # GQA: head_dim; MLA: qk_nope_head_dim + qk_rope_head_dim
    dense_layers: int = 0  # layers with a dense MLP instead of experts (DeepSeek: first_k_dense_replace)
    dense_intermediate: int = 0  # their MLP's intermediate_size
    shared_experts: int = 0  # n_shared_experts, each of moe_intermediate
    tied_embeddings: bool = False  # tie_word_embeddings
    qk_norm: bool = False  # Qwen3: RMSNorm of q and k per head
    router_bias: bool = False  # DeepSeek-V3: e_score_correction_bias per expert
    # multi-head latent attention (DeepSeek-V3); all 0 for grouped-query attention
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    published_b: float = 0.0  # total parameters on the model card, billions

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    def expert_params(self) -> int:
        """One routed expert's gate, up and down matrices."""
        return 3 * self.hidden * self.moe_intermediate

    def attention_params(self) -> int:
        """One layer's attention projections (and MLA's / Qwen3's own norms)."""
        h = self.hidden
        if self.mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.heads * qk) if self.q_lora_rank \
                else h * self.heads * qk
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + self.heads * self.v_head_dim * h
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return h * q + 2 * h * kv + q * h + (2 * self.head_dim if self.qk_norm else 0)

    def params(self) -> dict:
        """Parameters by part: ``routed experts`` (what EP shards) and the rest, which every GPU holds."""
        h = self.hidden
        return {
            "routed experts": self.moe_layers * self.experts * self.expert_params(),
            "shared experts": self.moe_layers * self.shared_experts * self.expert_params(),
            "dense MLP layers": self.dense_layers * 3 * h * self.dense_intermediate,
            "attention": self.layers * self.attention_params(),
            "routers": self.moe_layers * (h * self.experts + (self.experts if self.router_bias else 0)),
            "norms": 2 * self.layers * h + h,
            "embeddings and LM head": self.vocab * h * (1 if self.tied_embeddings else 2),
        }

    def total_params(self) -> int:
        return sum(self.params().values())

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """The KV cache of one token over all layers: MLA caches its compressed latent and the rope key
        (``kv_lora_rank + qk_rope_head_dim``); grouped-query attention a key and a value per KV head."""
        per_layer = (self.kv_lora_rank + self.qk_rope_head_dim) if self.mla else 2 * self.kv_heads * self.head_dim
        return self.layers * per_layer * dtype_bytes


MODELS = (
    ModelConfig("DeepSeek-V3 / R1", "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json "
                "(DeepSeek-R1's config.json has the same numbers)",
                hidden=7168, layers=61, experts=256, top_k=8, moe_intermediate=2048, vocab=129280, heads=128,
                kv_heads=128, head_dim=192, dense_layers=3, dense_intermediate=18432, shared_experts=1,
                router_bias=True, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                v_head_dim=128, published_b=671),
    ModelConfig("Qwen3-235B-A22B", "https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json",
                hidden=4096, layers=94, experts=128, top_k=8, moe_intermediate=1536, vocab=151936, heads=64,
                kv_heads=4, head_dim=128, qk_norm=True, published_b=235),
    ModelConfig("Qwen3-30B-A3B", "https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json",
                hidden=2048, layers=48, experts=128, top_k=8, moe_intermediate=768, vocab=151936, heads=32,
                kv_heads=4, head_dim=128, qk_norm=True, published_b=30.5),
    ModelConfig("Mixtral-8x7B", "https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
                hidden=4096, layers=32, experts=8, top_k=2, moe_intermediate=14336, vocab=32000, heads=32, kv_heads=8,
                head_dim=128, published_b=46.7),
    ModelConfig("Mixtral-8x22B", "https://huggingface.co/mistralai/Mixtral-8x22B-Instruct-v0.1/blob/main/config.json "
                "(the base v0.1 has vocab_size 32000)",
                hidden=6144, layers=56, experts=8, top_k=2, moe_intermediate=16384, vocab=32768, heads=48, kv_heads=8,
                head_dim=128, published_b=141),
)


def get_model(name: str) -> ModelConfig:
    for m in MODELS:
        if m.name == name or name in m.name:
            return m
    raise ValueError(f"unknown model {name!r}; known: {', '.join(m.name for m in MODELS)}")
