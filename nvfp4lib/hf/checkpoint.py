"""NVFP4 checkpoints on disk: which format a folder holds, its tensors by name, and one quantized Linear's parts.

Two formats store the same encoding (codes ``uint8 [N, K/2]``, element 2j in the low nibble, exactly
:mod:`nvfp4lib.formats`' order; block scales ``float8_e4m3fn [N, K/16]``, row-major) and differ in their per-tensor
numbers:

============================  ==========================  ===============================  ===========================
format                        codes, block scales         weight global (nvfp4lib's)       activation global
============================  ==========================  ===============================  ===========================
ModelOpt ``NVFP4``            ``weight``, ``weight_scale``  ``weight_scale_2``             ``input_scale``
compressed-tensors            ``weight_packed``,          ``1 / weight_global_scale``      ``1 / input_global_scale``
``nvfp4-pack-quantized``      ``weight_scale``
============================  ==========================  ===============================  ===========================

A value is ``e2m1 · block scale · global`` (:class:`~nvfp4lib.formats.NVFP4Tensor`). ModelOpt's formula is that
product: decoding is exact. compressed-tensors divides by its stored scale (``W = e2m1 · weight_scale /
weight_global_scale``); the kernels multiply by a float32 global, so the global is the float32 reciprocal, one
rounding (relative error at most 2**-24; none when the stored scale is a power of two). The activation globals
follow: ModelOpt quantizes with ``1 / input_scale`` (so the dequantizing global is ``input_scale`` itself),
compressed-tensors with ``input_global_scale`` (global ``1 / input_global_scale``).

Every read checks the tensor's dtype and shape and raises :class:`CheckpointError` naming the file and the tensor.
"""
from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..formats import BLOCK_SIZE, NVFP4Tensor

__all__ = ["CheckpointError", "QuantScheme", "Checkpoint", "read_scheme", "read_config", "read_nvfp4", "FIELDS",
           "KV_CACHE_LEAVES"]

FORMATS = ("modelopt", "compressed-tensors")
# the tensors of one quantized Linear, per format: codes, block scales, weight global, activation global
FIELDS = {
    "modelopt": {"codes": "weight", "scales": "weight_scale", "global": "weight_scale_2", "input": "input_scale"},
    "compressed-tensors": {"codes": "weight_packed", "scales": "weight_scale", "global": "weight_global_scale",
                           "input": "input_global_scale"},
}
# scales of an FP8 KV cache (ModelOpt's kv_cache_quant_algo, compressed-tensors' kv_cache_scheme): the cache stays bf16
KV_CACHE_LEAVES = ("k_scale", "v_scale", "q_scale", "prob_scale")
CT_FORMAT = "nvfp4-pack-quantized"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is: the message names the file and the tensor or setting."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


@dataclass(frozen=True)
class QuantScheme:
    """What a checkpoint's quantization config says: its ``format`` (one of ``FORMATS``), the modules it leaves
    unquantized (ModelOpt ``exclude_modules``: fnmatch patterns; compressed-tensors ``ignore``: names or ``re:``
    regexes), where that was read (``source``), and notes for the load report."""

    format: str
    exclude: tuple[str, ...] = ()
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def fields(self) -> dict:
        return FIELDS[self.format]

    @property
    def marker_leaves(self) -> frozenset:
        """Tensor names (after the module's) that only a quantized module has."""
        f = self.fields
        return frozenset((f["scales"], f["global"], f["input"]) + ((f["codes"],) if f["codes"] != "weight" else ()))

    def excluded(self, module: str) -> bool:
        """Whether the config leaves ``module`` (a checkpoint module name) unquantized."""
        for p in self.exclude:
            if self.format == "modelopt":
                if fnmatch.fnmatchcase(module, p):
                    return True
            elif p.startswith("re:"):
                if re.match(p[3:], module):
                    return True
            elif module == p:
                return True
        return False


def read_config(path) -> dict:
    """``config.json`` of the checkpoint folder, as a dict."""
    return _read_json(Path(path) / "config.json")


def read_scheme(path) -> QuantScheme:
    """The quantization scheme of the checkpoint folder ``path``: ``hf_quant_config.json`` (ModelOpt) if present,
    else ``config.json``'s ``quantization_config``. Anything but NVFP4 with 16-element blocks is refused."""
    path = Path(path)
    hq = path / "hf_quant_config.json"
    if hq.exists():
        q = _read_json(hq).get("quantization")
        if not isinstance(q, dict):
            raise CheckpointError(f"{hq}: no 'quantization' section")
        return _modelopt_scheme(q, str(hq))
    cfg_path = path / "config.json"
    qc = _read_json(cfg_path).get("quantization_config")
    if qc is None:
        raise CheckpointError(f"{path}: neither hf_quant_config.json nor a quantization_config in config.json: not a "
                              "quantized checkpoint (a bf16 model's experts can be quantized with "
                              "nvfp4lib.nn.hf.swap_moe_blocks)")
    method = qc.get("quant_method")
    if method == "modelopt":
        return _modelopt_scheme(qc.get("quantization", qc), f"{cfg_path} (quantization_config)")
    if method == "compressed-tensors":
        return _ct_scheme(qc, f"{cfg_path} (quantization_config)")
    raise CheckpointError(f"{cfg_path}: quantization_config.quant_method is {method!r}; nvfp4lib loads 'modelopt' "
                          "(quant_algo NVFP4) and 'compressed-tensors' (format nvfp4-pack-quantized)")


def _modelopt_scheme(q: dict, source: str) -> QuantScheme:
    algo = q.get("quant_algo")
    if algo != "NVFP4":
        raise CheckpointError(f"{source}: quant_algo is {algo!r}; nvfp4lib loads ModelOpt's 'NVFP4' only")
    gs = q.get("group_size", BLOCK_SIZE)
    if gs != BLOCK_SIZE:
        raise CheckpointError(f"{source}: group_size is {gs}; NVFP4 blocks are {BLOCK_SIZE} elements")
    notes = ()
    if q.get("kv_cache_quant_algo"):
        notes = (f"kv_cache_quant_algo {q['kv_cache_quant_algo']!r} ignored: the KV cache stays bf16 "
                 "(its scales are not read)",)
    return QuantScheme("modelopt", tuple(q.get("exclude_modules") or ()), source, notes)


def _ct_scheme(qc: dict, source: str) -> QuantScheme:
    fmt = qc.get("format")
    groups = qc.get("config_groups") or {}
    if not groups:
        raise CheckpointError(f"{source}: no config_groups")
    for name, g in groups.items():
        gfmt = g.get("format") or fmt
        if gfmt != CT_FORMAT:
            raise CheckpointError(f"{source}: config group {name!r} has format {gfmt!r}; nvfp4lib loads "
                                  f"compressed-tensors' {CT_FORMAT!r} only")
        w = g.get("weights") or {}
        if (w.get("num_bits"), w.get("type"), w.get("group_size")) != (4, "float", BLOCK_SIZE):
            raise CheckpointError(f"{source}: config group {name!r} quantizes weights as num_bits={w.get('num_bits')}, "
                                  f"type={w.get('type')!r}, group_size={w.get('group_size')}; NVFP4 is 4, 'float', 16")
        a = g.get("input_activations")
        if a and (a.get("num_bits"), a.get("type")) != (4, "float"):
            raise CheckpointError(f"{source}: config group {name!r} quantizes activations as num_bits="
                                  f"{a.get('num_bits')}, type={a.get('type')!r}; nvfp4lib runs NVFP4 (4, 'float') or "
                                  "bf16 activations")
    notes = ()
    if qc.get("kv_cache_scheme"):
        notes = ("kv_cache_scheme ignored: the KV cache stays bf16 (its scales are not read)",)
    return QuantScheme("compressed-tensors", tuple(qc.get("ignore") or ()), source, notes)


class Checkpoint:
    """The safetensors files of a checkpoint folder: ``model.safetensors.index.json``'s weight map when there is one,
    else every ``*.safetensors`` file. Tensors are read one at a time (:meth:`get`), never a whole file."""

    def __init__(self, path):
        from safetensors import safe_open

        self.path = Path(path)
        self._safe_open = safe_open
        self._handles: dict = {}
        index = self.path / "model.safetensors.index.json"
        if index.exists():
            wm = _read_json(index).get("weight_map")
            if not isinstance(wm, dict) or not wm:
                raise CheckpointError(f"{index}: no weight_map")
            for f in sorted(set(wm.values())):
                if not (self.path / f).exists():
                    raise CheckpointError(f"{index} names {f}, which is not in {self.path}")
            self.where = dict(wm)
        else:
            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"{self.path}: no *.safetensors file and no model.safetensors.index.json")
            self.where = {}
            for f in files:
                for name in self._handle(f.name).keys():
                    if name in self.where:
                        raise CheckpointError(f"tensor {name!r} is in both {self.where[name]} and {f.name}")
                    self.where[name] = f.name

    def _handle(self, file: str):
        h = self._handles.get(file)
        if h is None:
            h = self._handles[file] = self._safe_open(str(self.path / file), framework="pt", device="cpu")
        return h

    @property
    def names(self) -> list[str]:
        return list(self.where)

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def file_of(self, name: str) -> str:
        return self.where.get(name, "?")

    def get(self, name: str) -> torch.Tensor:
        """The tensor ``name`` on the CPU (memory-mapped, one tensor)."""
        if name not in self.where:
            raise CheckpointError(f"{self.path}: missing tensor {name!r}")
        file = self.where[name]
        try:
            return self._handle(file).get_tensor(name)
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{self.path / file}: cannot read tensor {name!r} ({e})") from None

    def close(self) -> None:
        self._handles.clear()


def _where(ckpt: Checkpoint, name: str) -> str:
    return f"{ckpt.path / ckpt.file_of(name)}: tensor {name!r}"


def _scalar(ckpt: Checkpoint, name: str, what: str) -> torch.Tensor:
    """A per-tensor scale: one float32 or bf16 number (0-d or ``[1]``), finite and > 0, as float32 0-d (CPU)."""
    t = ckpt.get(name)
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16) or t.numel() != 1:
        raise CheckpointError(f"{_where(ckpt, name)}: the {what} must be one float32 (or bf16) number, got "
                              f"{t.dtype} of shape {tuple(t.shape)}")
    v = t.reshape(()).to(torch.float32)
    if not (float(v) > 0.0 and float(v) != float("inf")):
        raise CheckpointError(f"{_where(ckpt, name)}: the {what} must be finite and > 0, got {float(v)}")
    return v


def read_nvfp4(ckpt: Checkpoint, scheme: QuantScheme, module: str, device, shape: tuple[int, int] | None = None):
    """One quantized Linear ``module`` (checkpoint name) as ``(NVFP4Tensor on device, activation global scale or
    None)``, both per :data:`FIELDS` and the module docstring. ``shape``: the ``(N, K)`` the model expects."""
    f = scheme.fields
    codes_name, scales_name = f"{module}.{f['codes']}", f"{module}.{f['scales']}"
    codes, scales = ckpt.get(codes_name), ckpt.get(scales_name)
    if codes.dtype != torch.uint8 or codes.dim() != 2:
        raise CheckpointError(f"{_where(ckpt, codes_name)}: NVFP4 codes must be uint8 [N, K/2], got {codes.dtype} "
                              f"of shape {tuple(codes.shape)}")
    n, k = codes.shape[0], 2 * codes.shape[1]
    if k == 0 or k % BLOCK_SIZE:
        raise CheckpointError(f"{_where(ckpt, codes_name)}: K = {k} (2 x {codes.shape[1]} bytes) is not a positive "
                              f"multiple of {BLOCK_SIZE}")
    if shape is not None and (n, k) != tuple(shape):
        raise CheckpointError(f"{_where(ckpt, codes_name)}: holds a [{n}, {k}] weight but the model's layer is "
                              f"{list(shape)} ([out_features, in_features])")
    if scales.dtype != torch.float8_e4m3fn or tuple(scales.shape) != (n, k // BLOCK_SIZE):
        raise CheckpointError(f"{_where(ckpt, scales_name)}: block scales must be float8_e4m3fn "
                              f"[{n}, {k // BLOCK_SIZE}], got {scales.dtype} of shape {tuple(scales.shape)}")
    g = _scalar(ckpt, f"{module}.{f['global']}", "weight's per-tensor scale")
    if scheme.format == "compressed-tensors":
        g = torch.reciprocal(g)  # W = e2m1 · weight_scale / weight_global_scale
    w = NVFP4Tensor(codes.to(device).contiguous(), scales.to(device).contiguous(), g.to(device))
    a = None
    input_name = f"{module}.{f['input']}"
    if input_name in ckpt:
        a = _scalar(ckpt, input_name, "activation scale")
        if scheme.format == "compressed-tensors":
            a = torch.reciprocal(a)  # input_global_scale is the quantizing multiplier
    return w, a
