"""The NVFP4 linear layer: one ``[N, K]`` NVFP4 weight on the serving path, ``y = x·Wᵀ (+ bias)``.

``NVFP4Linear(weight)`` prepares the weight once as a one-group :func:`nvfp4lib.serving.prepare_weights` (the grouped
GEMM with G = 1: the same kernel, configs and tuning cache as the experts). Each forward flattens x to ``[T, K]`` and

- ``activations="nvfp4"`` (W4A4): quantizes x to NVFP4, per 16 elements on the fly, with ``input_scale`` as its
  global scale when one is given (a checkpoint's static activation scale: no amax pass per call), else one computed
  per call from the device (``amax / (6·448)``, as :class:`~nvfp4lib.nn.NVFP4MoE` does);
- ``activations="bf16"`` (W4A16): feeds x in bf16 to the GEMM as it is.

The group offsets ``[0, T]`` are kept per row count on the device; nothing is read back to the host, so the forward
runs in a CUDA graph; under ``torch.compile`` it is one opaque custom op, ``nvfp4lib::linear``, running the eager
forward (:mod:`.compiled`). The output is bf16 from the GEMM, cast to x's dtype.
"""
from __future__ import annotations

import torch

from ..formats import NVFP4Tensor, quantize
from ..serving import SERVING_BACKENDS, prepare_weights
from . import compiled
from .moe import ACTIVATIONS, resolve_quantizer
from .quant import quantize_rows, static_scale

__all__ = ["NVFP4Linear"]


class NVFP4Linear(torch.nn.Module):
    """A linear layer with an NVFP4 weight ``[N, K]`` (see the module doc).

    ``bias``: None or a float ``[N]`` tensor, added in x's dtype. ``input_scale``: the NVFP4 *global* scale of the
    activations in W4A4 mode (a value is ``e2m1 · block scale · input_scale``: ModelOpt's ``input_scale``,
    compressed-tensors' ``1 / input_global_scale``), or None for one per call. ``keep_weight=False`` drops the
    NVFP4Tensor once the serving path holds its own copy (the cute-hopper backend packs the weight; a loader that
    builds many layers keeps only that)."""

    def __init__(self, weight: NVFP4Tensor, bias: torch.Tensor | None = None, *, input_scale=None,
                 activations: str = "nvfp4", backend: str = "cute-hopper", quantizer: str = "auto",
                 keep_weight: bool = True):
        super().__init__()
        if not isinstance(weight, NVFP4Tensor) or len(weight.shape) != 2:
            raise TypeError(f"weight must be a 2-D NVFP4Tensor [N, K], got {type(weight).__name__}"
                            f"{tuple(weight.shape) if isinstance(weight, NVFP4Tensor) else ''}")
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {ACTIVATIONS}, got {activations!r}")
        if backend not in SERVING_BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; known: {', '.join(SERVING_BACKENDS)}")
        self.out_features, self.in_features = (int(d) for d in weight.shape)
        self.device = weight.device
        if bias is not None:
            if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (self.out_features,):
                raise ValueError(f"bias must be a [N={self.out_features}] tensor, got "
                                 f"{tuple(getattr(bias, 'shape', ()))}")
            bias = torch.nn.Parameter(bias.detach().to(self.device), requires_grad=False)
        self.bias = bias
        self.activations, self.backend = activations, backend
        self.quantizer = resolve_quantizer(quantizer, self.device)
        self.input_scale = None if input_scale is None else static_scale(input_scale, self.device, "input_scale")
        self.weight = weight if keep_weight else None
        self.w = prepare_weights([weight], backend=backend, out_dtype=torch.bfloat16, activations=activations)
        self._offsets: dict[int, torch.Tensor] = {}
        self._handle = compiled.handle(self)  # the module's name in the op torch.compile records (:mod:`.compiled`)

    @classmethod
    def from_float(cls, linear, **kwargs) -> "NVFP4Linear":
        """Quantize a ``torch.nn.Linear`` (or a float ``[N, K]`` weight) with ``formats.quantize``'s default global
        scale and build the layer on its device."""
        w, b = (linear.weight, linear.bias) if isinstance(linear, torch.nn.Linear) else (linear, None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
            raise TypeError(f"from_float needs an nn.Linear or a 2-D float tensor, got {type(linear).__name__}")
        return cls(quantize(w.detach()), None if b is None else b.detach(), **kwargs)

    def extra_repr(self) -> str:
        static = "static" if self.input_scale is not None else "per call"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activations={self.activations!r} (activation scale {static}), backend={self.backend!r}")

    def _group_offsets(self, rows: int, device) -> torch.Tensor:
        # [0, T] int32 on the device. Kept per T outside capture and tracing; inside, made by a kernel (a tensor cached
        # during a CUDA graph capture would only hold its values once the graph replays).
        if torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return torch.arange(2, dtype=torch.int32, device=device) * rows
        o = self._offsets.get(rows)
        if o is None:
            o = self._offsets[rows] = torch.tensor([0, rows], dtype=torch.int32, device=device)
        return o

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features or not x.is_floating_point():
            raise ValueError(f"x must be a float [..., K={self.in_features}] tensor, got {x.dtype} {tuple(x.shape)}")
        if x.device != self.device:
            raise ValueError(f"x is on {x.device} but the weight is on {self.device}")
        if torch.compiler.is_compiling() and compiled.opaque(x):
            return compiled.linear(x, self._handle)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        offsets = self._group_offsets(x2.shape[0], x2.device)
        if self.activations == "nvfp4":
            codes, scales, g = self._quantize(x2)
            a = NVFP4Tensor(codes, scales, g.reshape(()))
            y = self.w(a, offsets, global_scale=g)
        else:
            y = self.w(x2.to(torch.bfloat16).contiguous(), offsets)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*lead, self.out_features)

    def _quantize(self, x: torch.Tensor):
        if self.quantizer == "triton" and not torch.compiler.is_compiling():
            from .quant_triton import quantize_rows_triton

            return quantize_rows_triton(x.contiguous(), self.input_scale)
        return quantize_rows(x, self.input_scale)
