"""Why two copies of one model disagree: each NVFP4 module on the same input, and the model's own sensitivity.

Two loads of one checkpoint (say the cute-hopper backend on a GPU and the reference backend on the CPU) give logits
that differ for two reasons that a whole-model comparison cannot tell apart:

1. a module computes something else (a kernel bug, a scale applied differently): :func:`module_errors` finds it.
   It runs ``model`` once with a forward hook on every :class:`~nvfp4lib.nn.NVFP4Linear` and
   :class:`~nvfp4lib.nn.NVFP4MoE` recording its inputs and output, then calls the module of the same name in
   ``reference`` on each recorded input (teacher forcing: the reference module sees exactly what the model's saw,
   routing included) and compares the outputs. A wrong module shows its error there, however the layers after it
   amplify it; modules that are right show only their own rounding.
2. rounding that the model amplifies: W4A4 re-quantizes every layer's input to FP4, so an activation that differs in
   its last bf16 bit (another attention kernel, another summation order) can move an E2M1 code or a block scale by a
   whole step, and the next layers spread that. :func:`one_ulp_spread` measures how far a model's logits move when
   every input embedding moves by one ulp: a difference no larger than that is the model's, not a module's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..nn.linear import NVFP4Linear
from ..nn.moe import NVFP4MoE

__all__ = ["ModuleError", "nvfp4_modules", "module_errors", "one_ulp", "one_ulp_spread", "rel_err"]


@dataclass(frozen=True)
class ModuleError:
    """One module's outputs against the reference module's on the same inputs: normwise relative error (fp64, over
    every element of every call) and the largest absolute difference."""
    name: str
    kind: str
    calls: int
    rel_err: float
    max_abs: float

    def __str__(self) -> str:
        return (f"{self.name} ({self.kind}, {self.calls} call(s)): rel_err {self.rel_err:.3g}, "
                f"max_abs {self.max_abs:.3g}")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """``‖got − want‖ / ‖want‖`` in fp64 on the CPU (0 when both are zero, inf when only ``want`` is)."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    if got.shape != want.shape:
        raise ValueError(f"shapes differ: {tuple(got.shape)} against {tuple(want.shape)}")
    diff, den = float((got - want).norm()), float(want.norm())
    return diff / den if den else (0.0 if diff == 0 else float("inf"))


def nvfp4_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The model's NVFP4Linear and NVFP4MoE modules by name, in module order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, (NVFP4Linear, NVFP4MoE))}


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def module_errors(model: torch.nn.Module, reference: torch.nn.Module, *args, **kwargs):
    """Run ``model(*args, **kwargs)`` (no grad) recording every NVFP4 module's calls, replay each call's inputs
    through ``reference``'s module of the same name (on its device) and return ``(model's output, errors)``, the
    :class:`ModuleError` of each module that was called, worst first. ``reference`` must hold the same NVFP4 modules
    (names and kinds); a module of the model that is never called is left out."""
    mods, refs = nvfp4_modules(model), nvfp4_modules(reference)
    if not mods:
        raise ValueError(f"{type(model).__name__} has no NVFP4Linear or NVFP4MoE module to compare")
    for name, m in mods.items():
        r = refs.get(name)
        if type(r) is not type(m):
            raise ValueError(f"the reference has no {type(m).__name__} at {name!r} "
                             f"(it has {type(r).__name__ if r is not None else 'nothing'} there)")
    calls: dict[str, list] = {n: [] for n in mods}

    def recorder(name):
        def hook(module, a, kw, out):
            calls[name].append((_to(a, "cpu"), _to(kw, "cpu"), out.detach().cpu()))
        return hook

    handles = [m.register_forward_hook(recorder(n), with_kwargs=True) for n, m in mods.items()]
    try:
        with torch.no_grad():
            output = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    errors = []
    with torch.no_grad():
        for name, seen in calls.items():
            if not seen:
                continue
            ref = refs[name]
            dev = ref.device  # NVFP4Linear and NVFP4MoE live on their weights' device
            got = torch.cat([out.reshape(-1) for _, _, out in seen])
            want = torch.cat([ref(*_to(a, dev), **_to(kw, dev)).detach().cpu().reshape(-1) for a, kw, _ in seen])
            errors.append(ModuleError(name, type(mods[name]).__name__, len(seen), rel_err(got, want),
                                      float((got.double() - want.double()).abs().max())))
    return output, sorted(errors, key=lambda e: -e.rel_err)


def one_ulp(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` (a bf16 or fp16 tensor) with every nonzero element moved by one unit in the last place, up or down in
    magnitude at random (seeded): the smallest change a rounding makes."""
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"one_ulp moves a bf16 or fp16 tensor's elements, got {x.dtype}")
    step = torch.randint(0, 2, x.shape, generator=torch.Generator().manual_seed(seed)).to(torch.int16) * 2 - 1
    bits = x.detach().cpu().contiguous().view(torch.int16)
    return torch.where(x.cpu() != 0, (bits + step).view(x.dtype), x.cpu()).to(x.device)


def one_ulp_spread(model: torch.nn.Module, input_ids: torch.Tensor, seeds=(0, 1, 2)) -> list[float]:
    """Per seed, the normwise distance of a causal LM's logits on ``input_ids`` when every input embedding moves by
    one ulp (:func:`one_ulp`) from its logits as they are. Two copies of the model whose activations differ only
    in rounding differ by about this much, whatever their modules compute right."""
    dev = model.get_input_embeddings().weight.device
    with torch.no_grad():
        embeds = model.get_input_embeddings()(input_ids.to(dev))
        base = model(inputs_embeds=embeds).logits
        return [rel_err(model(inputs_embeds=one_ulp(embeds, s)).logits, base) for s in seeds]
