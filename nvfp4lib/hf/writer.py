"""Write a randomly initialised NVFP4 checkpoint, as ModelOpt or compressed-tensors export one (nothing downloaded).

:func:`make_checkpoint` enumerates the tensors of the architecture's transformers model (built on the meta device),
draws each one (``N(0, 0.02)``, norms 1) on ``device``, quantizes every Linear and expert projection with
:func:`nvfp4lib.formats.quantize` and writes them under the exporters' names, sharded with an index file. Like the
exporters, gate and up of an expert share their per-tensor scales, and so do q, k and v (``shared_scales=False``
draws them apart, to exercise the exact path). ``lm_head`` and the routers stay bf16 and are listed as excluded.
Activation scales are a fixed calibration (``amax 16``, jittered per module so experts differ), not measured.

Presets: ``"tiny"`` (tests) and ``"qwen3-30b-a3b"`` (Qwen3-30B-A3B's shape: 48 layers, 128 experts of top-8, hidden
2048, expert intermediate 768; ~17 GB on disk; use ``device="cuda"`` to draw it quickly).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..formats import E2M1_MAX, E4M3_MAX, quantize
from .archs import ARCHS
from .checkpoint import CT_FORMAT, FORMATS

__all__ = ["make_checkpoint", "model_config", "PRESETS"]

PRESETS = {
    "tiny": dict(layers=2, hidden=64, experts=8, moe_intermediate=32, intermediate=64, heads=4, kv_heads=2,
                 head_dim=16, vocab=128, top_k=2),
    "qwen3-30b-a3b": dict(arch="qwen3_moe", layers=48, hidden=2048, experts=128, moe_intermediate=768,
                          intermediate=6144, heads=32, kv_heads=4, head_dim=128, vocab=151936, top_k=8,
                          max_position=40960, rope_theta=1e6),
}
_ACT_AMAX = 16.0  # the activation range the written input scales encode (|x| up to 16 without clipping)


def model_config(arch: str, *, layers: int, hidden: int, experts: int, moe_intermediate: int,
                 intermediate: int | None = None, heads: int = 4, kv_heads: int = 2, head_dim: int | None = None,
                 vocab: int = 128, top_k: int = 2, max_position: int = 512, rope_theta: float = 1e6,
                 dense_layers: int = 1) -> dict:
    """A config.json dict for ``arch`` (``qwen3_moe``, ``mixtral``, ``deepseek_v3``) at these sizes.
    ``dense_layers``: DeepSeek-V3's dense first layers (``first_k_dense_replace``)."""
    head_dim = head_dim or hidden // heads
    intermediate = intermediate or 2 * hidden
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, num_experts_per_tok=top_k, max_position_embeddings=max_position,
                  rope_theta=rope_theta, tie_word_embeddings=False, torch_dtype="bfloat16")
    if arch == "qwen3_moe":
        return dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=experts,
                    moe_intermediate_size=moe_intermediate, intermediate_size=intermediate, head_dim=head_dim,
                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], **common)
    if arch == "mixtral":
        if moe_intermediate != intermediate:
            intermediate = moe_intermediate  # Mixtral's experts are intermediate_size wide
        return dict(model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=experts,
                    intermediate_size=intermediate, head_dim=head_dim, **common)
    if arch == "deepseek_v3":
        rope = max(8, head_dim // 4)
        return dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], n_routed_experts=experts,
                    n_shared_experts=1, moe_intermediate_size=moe_intermediate, intermediate_size=intermediate,
                    first_k_dense_replace=dense_layers, n_group=2 if experts % 2 == 0 else 1, topk_group=1,
                    q_lora_rank=hidden // 2, kv_lora_rank=hidden // 2, qk_rope_head_dim=rope,
                    qk_nope_head_dim=head_dim - rope, v_head_dim=head_dim, routed_scaling_factor=2.5,
                    norm_topk_prob=True, **{**common, "num_key_value_heads": heads})
    raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")


def _quant_config(fmt: str, arch) -> tuple[dict, list[str]]:
    if fmt == "modelopt":
        exclude = ["lm_head", f"*.{arch.block}.gate"]
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                "exclude_modules": exclude}, exclude
    scheme = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
    ignore = ["lm_head", rf"re:.*\.{arch.block}\.gate$"]
    return {"quant_method": "compressed-tensors", "format": CT_FORMAT, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "format": CT_FORMAT,
                                          "weights": {**scheme, "dynamic": False},
                                          "input_activations": {**scheme, "dynamic": "local"}}},
            "ignore": ignore}, ignore


class _Shards:
    """Tensors gathered into files of about ``shard_bytes``, named ``model-0000i-of-0000n.safetensors`` at the end."""

    def __init__(self, out: Path, shard_bytes: int):
        self.out, self.limit = out, shard_bytes
        self.current: dict = {}
        self.size = 0
        self.files: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, name: str, t: torch.Tensor) -> None:
        t = t.detach().to("cpu").contiguous()
        self.current[name] = t
        self.size += t.numel() * t.element_size()
        self.total += t.numel() * t.element_size()
        if self.size >= self.limit:
            self.flush()

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.current:
            return
        path = self.out / f"shard-{len(self.files):05d}.tmp"
        save_file(self.current, str(path), metadata={"format": "pt"})
        self.files.append((path, list(self.current)))
        self.current, self.size = {}, 0

    def finish(self) -> None:
        self.flush()
        n = len(self.files)
        weight_map = {}
        for i, (path, names) in enumerate(self.files):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            path.rename(self.out / final)
            weight_map.update({name: final for name in names})
        (self.out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": self.total}, "weight_map": weight_map}, indent=2) + "\n")


def _write_nvfp4(shards: _Shards, fmt: str, module: str, w: torch.Tensor, amax: float, act_amax: float) -> None:
    """Quantize ``w`` with the per-tensor scale of ``amax`` (shared across a fused group) and add its tensors."""
    amax = max(amax, 1e-30)
    if fmt == "modelopt":
        g = torch.tensor(amax / (E2M1_MAX * E4M3_MAX), dtype=torch.float32)
        q = quantize(w, global_scale=g)
        shards.add(f"{module}.weight", q.data)
        shards.add(f"{module}.weight_scale", q.scales)
        shards.add(f"{module}.weight_scale_2", g.clone())
        shards.add(f"{module}.input_scale", torch.tensor(act_amax / (E2M1_MAX * E4M3_MAX), dtype=torch.float32))
    else:  # compressed-tensors stores the quantizing multipliers, [1] each; the dequantizing global is 1/that
        wgs = torch.tensor([E2M1_MAX * E4M3_MAX / amax], dtype=torch.float32)
        q = quantize(w, global_scale=torch.reciprocal(wgs).reshape(()))
        shards.add(f"{module}.weight_packed", q.data)
        shards.add(f"{module}.weight_scale", q.scales)
        shards.add(f"{module}.weight_global_scale", wgs)
        shards.add(f"{module}.input_global_scale",
                   torch.tensor([E2M1_MAX * E4M3_MAX / act_amax], dtype=torch.float32))


def make_checkpoint(out, *, arch: str = "qwen3_moe", fmt: str = "modelopt", preset: str | None = "tiny",
                    seed: int = 0, device="cpu", shard_bytes: int = 2 << 30, shared_scales: bool = True,
                    progress: bool = False, **sizes) -> Path:
    """Write the checkpoint folder ``out`` (config.json, the quantization config, sharded safetensors with an index)
    and return its path. ``sizes`` override the preset's fields (see :func:`model_config`)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    p = dict(PRESETS[preset]) if preset else {}
    arch = p.pop("arch", arch)
    p.update(sizes)
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    a = ARCHS[arch]
    config = model_config(arch, **p)
    qc, exclude = _quant_config(fmt, a)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    from .loader import build_skeleton

    skeleton = build_skeleton(config)
    modules = dict(skeleton.named_modules())
    gen = torch.Generator(device=device).manual_seed(seed)
    jitter = torch.Generator().manual_seed(seed + 1)

    def draw(shape):
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * 0.02

    def act_amax():
        return _ACT_AMAX * (0.5 + 0.5 * float(torch.rand((), generator=jitter)))

    shards = _Shards(out, shard_bytes)
    state = skeleton.state_dict(keep_vars=True)
    done = set()
    names = list(state)
    if progress:
        from tqdm.auto import tqdm

        names = tqdm(names, desc="writing", unit="tensor")
    for name in names:
        if name in done:
            continue
        mod, _, leaf = name.rpartition(".")
        m = modules.get(mod)
        cmod = a.to_checkpoint(mod)
        ref = state[name]
        if m is not None and getattr(m, "gate_up_proj", None) is not None and leaf in ("gate_up_proj", "down_proj"):
            _write_experts(shards, fmt, a, cmod, m, draw, act_amax, shared_scales)
            done.update({f"{mod}.gate_up_proj", f"{mod}.down_proj"})
        elif isinstance(m, torch.nn.Linear) and leaf == "weight" and mod != "lm_head":
            fused = _fused_group(mod, modules) if shared_scales else [mod]
            ws = {f: draw(modules[f].weight.shape) for f in fused}
            amax = max(float(w.abs().max()) for w in ws.values())
            act = act_amax()
            for f, w in ws.items():
                _write_nvfp4(shards, fmt, a.to_checkpoint(f), w, amax if shared_scales else float(w.abs().max()),
                             act)
                done.add(f"{f}.weight")
        elif "norm" in leaf or "norm" in mod.rsplit(".", 1)[-1]:
            shards.add(f"{cmod}.{leaf}", torch.ones(ref.shape, dtype=torch.bfloat16))
        elif leaf == "e_score_correction_bias":
            shards.add(f"{cmod}.{leaf}", torch.zeros(ref.shape, dtype=torch.float32))
        else:
            shards.add(f"{cmod}.{leaf}", draw(ref.shape).to(torch.bfloat16))
    shards.finish()
    config["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if fmt == "modelopt":
        (out / "hf_quant_config.json").write_text(json.dumps({
            "producer": {"name": "nvfp4lib.hf.make_checkpoint", "version": "0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                             "exclude_modules": exclude}}, indent=2) + "\n")
    return out


def _fused_group(mod: str, modules: dict) -> list[str]:
    """The Linears that exporters give one per-tensor scale with ``mod``: q/k/v, gate/up of a dense MLP."""
    parent, _, leaf = mod.rpartition(".")
    for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
        if leaf in group:
            return [f"{parent}.{g}" for g in group if isinstance(modules.get(f"{parent}.{g}"), torch.nn.Linear)]
    return [mod]


def _write_experts(shards, fmt, a, cmod, m, draw, act_amax, shared_scales: bool) -> None:
    n_exp, two_i, hidden = m.gate_up_proj.shape
    inter = two_i // 2
    for e in range(n_exp):
        gate, up, down = draw((inter, hidden)), draw((inter, hidden)), draw((hidden, inter))
        act = act_amax()
        if shared_scales:
            amax_g = amax_u = max(float(gate.abs().max()), float(up.abs().max()))
        else:
            amax_g, amax_u = float(gate.abs().max()), float(up.abs().max()) * 0.5  # clip up a little: a distinct scale
        _write_nvfp4(shards, fmt, f"{cmod}.{e}.{a.proj('gate')}", gate, amax_g, act)
        _write_nvfp4(shards, fmt, f"{cmod}.{e}.{a.proj('up')}", up, amax_u, act)
        _write_nvfp4(shards, fmt, f"{cmod}.{e}.{a.proj('down')}", down, float(down.abs().max()), act_amax())


def checkpoint_bytes(path) -> int:
    """Bytes of the safetensors files of a checkpoint folder."""
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))

