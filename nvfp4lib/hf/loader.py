"""Load an NVFP4 checkpoint (ModelOpt or compressed-tensors) into a transformers causal LM on the serving path.

:func:`from_pretrained` builds the model's skeleton from ``config.json`` on the meta device (no memory), then fills it
tensor by tensor, each read from its safetensors file and placed on ``device`` once:

- each layer's experts become one :class:`~nvfp4lib.nn.NVFP4MoE` built from the stored codes and scales (no bf16
  copy, no re-quantization; the per-expert NVFP4 tensors are dropped once the serving path holds its own), wrapped
  in :class:`.modules.NVFP4Experts` (with ``ep_group``: an :class:`~nvfp4lib.nn.EPMoE` of this rank's experts);
- every other quantized Linear (attention projections, shared experts, dense MLPs) becomes an
  :class:`~nvfp4lib.nn.NVFP4Linear`;
- everything else (embeddings, norms, routers, ``lm_head``, excluded modules) is loaded as stored, in the skeleton's
  dtype (bf16).

Which modules are quantized is read from the tensors (a module with block scales is); the config's exclusions are
checked against them (a module excluded by the config but stored quantized is an error).

Activation scales (W4A4): each NVFP4Linear takes its module's static scale. An expert layer takes one scale per
input, like vLLM: the maximum over its experts (and over gate and up) of the dequantizing global scales (ModelOpt's
``input_scale``, compressed-tensors' ``1/input_global_scale``), so no expert's calibrated range clips; a layer whose
checkpoint has no activation scales computes one per call (logged). Gate and up keep their own weight global scales
(the dual GEMM takes one per expert for each), so checkpoints whose gate and up differ load exactly.

Expert parallelism (``ep_group=``): each rank reads and holds only its experts of every MoE layer, as an
:class:`~nvfp4lib.nn.EPMoE`, and the rest of the model whole; the design (data-parallel attention, lockstep steps, the
fixed capacity, the activation scales taken over the group) is :mod:`.ep`'s docstring.

Errors (:class:`~.checkpoint.CheckpointError`) name the file and the tensor: a missing tensor, a wrong dtype or
shape, K not a multiple of 16, an unknown format, a quantized module the model has no Linear or experts for, a tensor
the model has no place for. Tensors deliberately not read (an FP8 KV cache's scales, layers past
``num_hidden_layers`` such as DeepSeek-V3's multi-token-prediction layer) are logged and listed in the model's
``nvfp4_load_report``.
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from pathlib import Path

import torch

from ..nn.ep import EPMoE
from ..nn.linear import NVFP4Linear
from ..nn.moe import NVFP4MoE
from .archs import EXPERT_RE, Arch, arch_of
from .checkpoint import KV_CACHE_LEAVES, Checkpoint, CheckpointError, read_config, read_nvfp4, read_scheme
from .ep import ExpertParallel
from .modules import NVFP4Experts
from .modules import set_module_tensor as _set

__all__ = ["from_pretrained", "build_skeleton"]

log = logging.getLogger("nvfp4lib.hf")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def build_skeleton(config: dict, dtype=torch.bfloat16) -> torch.nn.Module:
    """The transformers causal LM of ``config`` (a config.json dict, its quantization_config ignored) on the meta
    device: every parameter and buffer shaped, none allocated."""
    import transformers

    cfg = {k: v for k, v in config.items() if k not in ("quantization_config", "architectures", "transformers_version",
                                                         "torch_dtype", "dtype")}
    hf_config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    return model.eval().requires_grad_(False)


def _is_experts(module: torch.nn.Module) -> bool:
    gu, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return isinstance(gu, torch.nn.Parameter) and isinstance(down, torch.nn.Parameter) and gu.dim() == 3


class _Plan:
    """The checkpoint's tensors sorted by what becomes of them (names translated to the model's)."""

    def __init__(self, ckpt: Checkpoint, scheme, arch: Arch, num_layers: int):
        leaves = defaultdict(dict)  # checkpoint module -> {leaf: tensor name}
        self.ignored: list[str] = []
        for name in ckpt.names:
            m = _LAYER_RE.match(name)
            if m and int(m.group(1)) >= num_layers:
                self.ignored.append(f"{name} (layer {m.group(1)} >= num_hidden_layers = {num_layers})")
                continue
            mod, _, leaf = name.rpartition(".")
            if leaf in KV_CACHE_LEAVES:
                self.ignored.append(f"{name} (KV-cache scale: the cache stays bf16)")
                continue
            leaves[mod][leaf] = name
        markers, allowed = scheme.marker_leaves, set(scheme.fields.values()) | {"bias"}
        self.experts = defaultdict(dict)  # model experts module -> {(e, role): (checkpoint module, leaves)}
        self.linears = {}  # model module -> (checkpoint module, leaves)
        self.plain = {}  # model tensor name -> checkpoint tensor name
        self.plain_experts = set()  # model experts modules with unquantized per-expert tensors
        for mod, lv in leaves.items():
            quantized = bool(markers & set(lv))
            em = EXPERT_RE.match(arch.to_model(mod))
            if quantized:
                odd = sorted(set(lv) - allowed)
                if odd:
                    raise CheckpointError(f"{ckpt.path / ckpt.file_of(lv[odd[0]])}: tensor {lv[odd[0]]!r} is not "
                                          f"one of a quantized Linear's ({', '.join(sorted(allowed))})")
                if scheme.excluded(mod):
                    any_name = lv[next(iter(markers & set(lv)))]
                    raise CheckpointError(f"{ckpt.path / ckpt.file_of(any_name)}: {mod!r} is stored quantized "
                                          f"({any_name!r}) but {scheme.source} excludes it from quantization")
            if em:
                role = arch.roles.get(em["proj"])
                if role is None:
                    raise CheckpointError(f"{ckpt.path / ckpt.file_of(next(iter(lv.values())))}: expert projection "
                                          f"{mod!r}: {arch.model_type} experts have {', '.join(arch.roles)}")
                if not quantized:
                    self.plain_experts.add(em["experts"])
                    continue
                self.experts[em["experts"]][(int(em["e"]), role)] = (mod, lv)
            elif quantized:
                self.linears[arch.to_model(mod)] = (mod, lv)
            else:
                for leaf, name in lv.items():
                    self.plain[f"{arch.to_model(mod)}.{leaf}"] = name


def _max_scale(scales: list, what: str, notes: list, ep: ExpertParallel | None) -> torch.Tensor | None:
    """The layer's activation scale: the maximum of its projections' (None if none has one); under ``ep``, of every
    rank's projections (one all-gather: every rank calls this for every layer, in the same order)."""
    present = [float(s) for s in scales if s is not None]  # float32 numbers: exact as Python floats
    n_present, n, hi, lo = len(present), len(scales), max(present, default=0.0), min(present, default=float("inf"))
    if ep is not None:
        g = ep.gathered([n_present, n, hi, lo])  # [world, 4]
        n_present, n, hi, lo = int(g[:, 0].sum()), int(g[:, 1].sum()), float(g[:, 2].max()), float(g[:, 3].min())
    if not n_present:
        return None
    if n_present != n:
        raise CheckpointError(f"{what}: {n_present} of {n} projections have an activation scale; a checkpoint has "
                              "them for all or none")
    if hi != lo:
        notes.append(f"{what}: activation scales differ ({lo:.4g} .. {hi:.4g}); the maximum is used for the whole "
                     "layer")
    return torch.tensor(hi, dtype=torch.float32)


def from_pretrained(path, *, activations: str = "nvfp4", device="cuda", ep_group=None, ep_capacity: int | None = None,
                    ep_transport: str = "all-gather", backend: str | None = None, quantizer: str = "auto",
                    progress: bool = False) -> torch.nn.Module:
    """A transformers causal LM from the NVFP4 checkpoint folder ``path`` (see the module doc), in eval mode.

    ``activations``: "nvfp4" (W4A4, with the checkpoint's static activation scales) or "bf16" (W4A16).
    ``backend``: the serving backend, default "cute-hopper" on CUDA and "reference" elsewhere.

    ``ep_group``: a process group (e.g. ``torch.distributed.group.WORLD``) to split the experts over (expert
    parallelism, :mod:`.ep`): every rank of it calls from_pretrained with the same arguments and its own ``device``,
    and gets a model holding its E/W experts of each MoE layer (an :class:`~nvfp4lib.nn.EPMoE`) and all the rest.
    Then ``ep_capacity`` (required) is the most tokens a rank runs per forward (its batch times the positions of a
    step; a forward over more raises ValueError), and ``ep_transport`` the EPMoE transport (``"all-gather"``, or
    ``"symm-mem"`` on CUDA). Every rank must call the model's forward in the same step (:func:`.generate` does). The
    model then carries ``nvfp4_ep`` (:class:`.ep.ExpertParallel`), else None.

    The model carries ``nvfp4_load_report`` (what became of each tensor). Architectures: ``qwen3_moe``, ``mixtral``,
    ``deepseek_v3``."""
    if activations not in ("nvfp4", "bf16"):
        raise ValueError(f"activations must be 'nvfp4' or 'bf16', got {activations!r}")
    path, device = Path(path), torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if ep_group is None and ep_capacity is not None:
        raise ValueError("ep_capacity is given but ep_group is None: expert parallelism needs the process group")
    if ep_group is not None and ep_capacity is None:
        raise ValueError("ep_group needs ep_capacity: the most tokens a rank runs per forward (its batch times the "
                         "positions of a step), which sizes the expert-parallel buffers")
    ep = None if ep_group is None else ExpertParallel(ep_group, ep_capacity, ep_transport, device)
    backend = backend or ("cute-hopper" if device.type == "cuda" else "reference")
    scheme = read_scheme(path)
    config = read_config(path)
    arch = arch_of(config, str(path / "config.json"))
    ckpt = Checkpoint(path)
    model = build_skeleton(config)
    text_config = model.config.get_text_config()
    plan = _Plan(ckpt, scheme, arch, text_config.num_hidden_layers)
    notes = list(scheme.notes)
    kw = dict(activations=activations, backend=backend, quantizer=quantizer)
    top_k = getattr(text_config, "num_experts_per_tok", None)
    modules = dict(model.named_modules())

    experts_modules = [n for n, m in modules.items() if _is_experts(m)]
    for name in plan.experts:
        if name not in experts_modules:
            mod, lv = next(iter(plan.experts[name].values()))
            raise CheckpointError(f"{ckpt.path / ckpt.file_of(next(iter(lv.values())))}: quantized experts under "
                                  f"{arch.to_checkpoint(name)!r}, but the {arch.model_type} model has no experts "
                                  f"module {name!r}")
    bar = _progress(progress, len(experts_modules) + len(plan.linears))
    for name in experts_modules:
        _load_experts(model, modules[name], name, plan, ckpt, scheme, arch, device, kw, notes, ep, top_k)
        bar.update(1)
    for name, (mod, lv) in plan.linears.items():
        _load_linear(model, modules.get(name), name, mod, lv, ckpt, scheme, device, kw, notes)
        bar.update(1)
    bar.close()
    n_plain = _load_plain(model, plan, ckpt, device)
    _finish(model, device, arch, ckpt)
    ckpt.close()

    for n in plan.ignored:
        log.info("not read: %s", n)
    for n in notes:
        log.info("%s", n)
    model.nvfp4_load_report = {
        "path": str(path), "format": scheme.format, "activations": activations, "backend": backend,
        "expert_layers": len(experts_modules), "nvfp4_linears": len(plan.linears), "plain_tensors": n_plain,
        "not_read": plan.ignored, "notes": notes, "ep": ep.report() if ep else None,
    }
    model.nvfp4_ep = ep
    log.info("loaded %s (%s): %d expert layers as %s, %d NVFP4Linear, %d tensors as stored; %d not read",
             path, scheme.format, len(experts_modules), repr(ep) if ep else "NVFP4MoE", len(plan.linears), n_plain,
             len(plan.ignored))
    return model


def _progress(on: bool, total: int):
    if on:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="loading", unit="module")

    class _Off:
        def update(self, n):
            pass

        def close(self):
            pass

    return _Off()


def _load_experts(model, module, name, plan, ckpt, scheme, arch, device, kw, notes, ep, top_k) -> None:
    stored = plan.experts.get(name)
    n_exp, two_i, hidden = module.gate_up_proj.shape
    inter = two_i // 2
    cname = arch.to_checkpoint(name)
    if not stored:
        f = scheme.fields
        if name in plan.plain_experts:
            raise CheckpointError(f"{ckpt.path}: the experts under {cname!r} are stored unquantized; from_pretrained "
                                  "loads NVFP4 experts (quantize a bf16 model with nvfp4lib.nn.hf.swap_moe_blocks)")
        raise CheckpointError(f"{ckpt.path}: missing tensor {cname}.0.{arch.proj('gate')}.{f['codes']} (no experts "
                              f"stored for {name!r})")
    extra = sorted({e for e, _ in stored if e >= n_exp})
    if extra:
        raise CheckpointError(f"{ckpt.path}: {cname!r} stores expert {extra[0]} but the model has {n_exp} experts")
    shapes = {"gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}
    w = {"gate": [], "up": [], "down": []}
    a = {"gate": [], "up": [], "down": []}
    for e in range(n_exp):  # names only: every rank checks every expert is there, reading none
        for role in ("gate", "up", "down"):
            if (e, role) not in stored:
                raise CheckpointError(f"{ckpt.path}: missing tensor {cname}.{e}.{arch.proj(role)}."
                                      f"{scheme.fields['codes']}")
    for e in range(n_exp) if ep is None else ep.experts(n_exp):
        for role in ("gate", "up", "down"):
            mod, _ = stored[(e, role)]
            t, s = read_nvfp4(ckpt, scheme, mod, device, shapes[role])
            w[role].append(t)
            a[role].append(s)
    input_scales = None
    if kw["activations"] == "nvfp4":
        gu = _max_scale(a["gate"] + a["up"], f"{cname} (gate and up)", notes, ep)
        dn = _max_scale(a["down"], f"{cname} (down)", notes, ep)
        if gu is None or dn is None:
            notes.append(f"{cname}: no activation scales stored; W4A4 computes one per call")
        else:
            input_scales = (gu, dn)
    if ep is None:
        moe = NVFP4MoE(w["gate"], w["up"], w["down"], input_scales=input_scales, keep_weights=False, **kw)
    else:
        moe = EPMoE(w["gate"], w["up"], w["down"], experts=n_exp, top_k=top_k, capacity=ep.capacity, group=ep.group,
                    transport=ep.transport, input_scales=input_scales, keep_weights=False, **kw)
    _set(model, name, NVFP4Experts(moe))


def _load_linear(model, module, name, mod, lv, ckpt, scheme, device, kw, notes) -> None:
    any_name = next(iter(lv.values()))
    where = f"{ckpt.path / ckpt.file_of(any_name)}: {mod!r} (tensor {any_name!r})"
    if module is None:
        raise CheckpointError(f"{where} is quantized, but the model has no module {name!r}")
    if not isinstance(module, torch.nn.Linear):
        raise CheckpointError(f"{where} is quantized, but the model's {name!r} is a {type(module).__name__}: "
                              "quantized modules other than Linear layers and experts are not supported")
    w, s = read_nvfp4(ckpt, scheme, mod, device, (module.out_features, module.in_features))
    bias = None
    if "bias" in lv:
        bias = ckpt.get(lv["bias"])
        if not bias.is_floating_point() or tuple(bias.shape) != (module.out_features,):
            raise CheckpointError(f"{ckpt.path / ckpt.file_of(lv['bias'])}: tensor {lv['bias']!r} must be a float "
                                  f"[{module.out_features}] bias, got {bias.dtype} {tuple(bias.shape)}")
        bias = bias.to(device, torch.bfloat16)
    elif module.bias is not None:
        raise CheckpointError(f"{where}: missing tensor {mod}.bias (the model's layer has a bias)")
    if kw["activations"] == "nvfp4" and s is None:
        notes.append(f"{mod}: no activation scale stored; W4A4 computes one per call")
    _set(model, name, NVFP4Linear(w, bias, input_scale=s if kw["activations"] == "nvfp4" else None,
                                  keep_weight=False, **kw))


def _load_plain(model, plan, ckpt, device) -> int:
    targets = dict(model.named_parameters())
    targets.update(dict(model.named_buffers()))
    for tname, cname in plan.plain.items():
        if tname not in targets:
            raise CheckpointError(f"{ckpt.path / ckpt.file_of(cname)}: tensor {cname!r} has no place in the "
                                  f"{type(model).__name__} (no parameter or buffer {tname!r})")
    n = 0
    for tname, ref in targets.items():
        if ref.device.type != "meta" or tname not in plan.plain:
            continue
        cname = plan.plain[tname]
        t = ckpt.get(cname)
        if not t.is_floating_point() or t.dtype == torch.float8_e4m3fn:
            raise CheckpointError(f"{ckpt.path / ckpt.file_of(cname)}: tensor {cname!r} is {t.dtype}; an unquantized "
                                  f"tensor must be float (the model's is {ref.dtype})")
        if tuple(t.shape) != tuple(ref.shape):
            raise CheckpointError(f"{ckpt.path / ckpt.file_of(cname)}: tensor {cname!r} has shape {tuple(t.shape)}; "
                                  f"the model's {tname!r} is {tuple(ref.shape)}")
        _set(model, tname, t.to(device, ref.dtype))
        n += 1
    return n


def _finish(model, device, arch: Arch, ckpt: Checkpoint) -> None:
    """Tie the output embedding where the config says so, rebuild computed buffers (rotary embeddings), and refuse
    anything still unfilled."""
    cfg = model.config.get_text_config()
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if getattr(cfg, "tie_word_embeddings", False) and out is not None and out.weight.device.type == "meta":
        out.weight = inp.weight
    for name, m in list(model.named_modules()):
        metas = [b for b in m._buffers.values() if b is not None and b.device.type == "meta"]
        if metas and type(m).__name__.endswith("RotaryEmbedding"):
            fresh = type(m)(m.config).to(device)  # computed from the config, on the CPU
            _set(model, name, fresh)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.device.type == "meta"]
    if left:
        names = ", ".join(repr(arch.to_checkpoint(n)) for n in left[:5])
        raise CheckpointError(f"{ckpt.path}: missing tensor {names}" + (f" and {len(left) - 5} more" if len(left) > 5
                                                                         else ""))
