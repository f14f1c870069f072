"""Adapter for the study's original harness (the gpu-mode ``nvfp4_group_gemm`` task format).

The harness passes ``data = (abc_tensors, sfasfb_tensors, [sfasfb_reordered_tensors,] problem_sizes)``:
``abc_tensors[g] = (a [M, K//2, L] float4_e2m1fn_x2, b [N, K//2, L], c [M, N, L] float16)``,
``sfasfb_tensors[g] = (sfa [M, K//16, L] float8_e4m3fn, sfb [N, K//16, L])``,
``problem_sizes[g] = (M, N, K, L)``; the kernel writes ``c`` and returns the list of ``c``.
Only L = 1 is supported (the study's harness always uses it). Global scales are 1.
"""
from __future__ import annotations

import torch

from .formats import NVFP4Tensor

__all__ = ["from_study_inputs", "custom_kernel"]


def _codes(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.dtype not in (torch.uint8, getattr(torch, "float4_e2m1fn_x2", torch.uint8)):
        raise TypeError(f"{what}: expected float4_e2m1fn_x2 (or uint8) packed codes, got {t.dtype}")
    return t.view(torch.uint8)


def _scales(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.dtype == torch.float8_e4m3fn:
        return t
    if t.dtype == getattr(torch, "float8_e4m3fnuz", None):
        v = t.float()
        fn = v.to(torch.float8_e4m3fn)
        if not torch.equal(fn.float(), v):
            raise ValueError(f"{what}: float8_e4m3fnuz scales not exactly representable in float8_e4m3fn")
        return fn
    raise TypeError(f"{what}: expected float8_e4m3fn scales, got {t.dtype}")


def _squeeze_l(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.dim() == 3:
        if t.shape[2] != 1:
            raise ValueError(f"{what}: only L = 1 is supported, got L = {t.shape[2]}")
        return t[..., 0]
    if t.dim() != 2:
        raise ValueError(f"{what}: expected [rows, cols, L] or [rows, cols], got shape {tuple(t.shape)}")
    return t


def from_study_inputs(data):
    """(a, b, c) from the harness tuple: lists of NVFP4Tensor and the harness's output tensors."""
    if not isinstance(data, (tuple, list)) or len(data) not in (3, 4):
        raise TypeError("data must be (abc_tensors, sfasfb_tensors, [sfasfb_reordered_tensors,] problem_sizes)")
    abc, sf, sizes = data[0], data[1], data[-1]
    if not (len(abc) == len(sf) == len(sizes)):
        raise ValueError(f"group counts differ: {len(abc)} abc, {len(sf)} scale pairs, {len(sizes)} sizes")
    a, b, c = [], [], []
    one = torch.tensor(1.0, dtype=torch.float32)
    for g, ((ta, tb, tc), (sa, sb), size) in enumerate(zip(abc, sf, sizes)):
        m, n, k = int(size[0]), int(size[1]), int(size[2])
        at = NVFP4Tensor(_squeeze_l(_codes(ta, f"a[{g}]"), f"a[{g}]").contiguous(),
                         _squeeze_l(_scales(sa, f"sfa[{g}]"), f"sfa[{g}]").contiguous(), one.to(ta.device))
        bt = NVFP4Tensor(_squeeze_l(_codes(tb, f"b[{g}]"), f"b[{g}]").contiguous(),
                         _squeeze_l(_scales(sb, f"sfb[{g}]"), f"sfb[{g}]").contiguous(), one.to(tb.device))
        if tuple(at.shape) != (m, k) or tuple(bt.shape) != (n, k):
            raise ValueError(f"group {g}: problem size (M={m}, N={n}, K={k}) does not match tensors "
                             f"a {tuple(at.shape)}, b {tuple(bt.shape)} (logical shapes)")
        a.append(at)
        b.append(bt)
        c.append(tc)
    return a, b, c


def custom_kernel(data, *, backend: str = "cute-hopper", **options):
    """The harness's entry point: compute every group with ``backend`` and write the harness's ``c``."""
    from .api import grouped_gemm

    a, b, c = from_study_inputs(data)
    for g, out in enumerate(grouped_gemm(a, b, backend=backend, **options)):
        c[g].view(out.shape[0], out.shape[1]).copy_(out) if c[g].dim() == 2 else c[g][..., 0].copy_(out)
    return c
