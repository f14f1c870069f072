"""Token routing for an MoE layer, on the device: token copies sorted by expert, group offsets, and the weighted
un-permute back to token order.

Nothing here reads a value back to the host, and every shape depends only on T, k and E, so both steps run inside a
CUDA graph and trace whole under ``torch.compile``. Expert ids must lie in ``[0, E)``; they are not checked (that
would synchronise), and a copy routed outside gets an unspecified row.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from ..serving import weighted_rows_torch
from . import quant
from .quant import AMAX_ROUTE_ELEMENTS, amax_tile

__all__ = ["ROUTE_GATHER", "AMAX_IN_ROUTE", "AMAX_ROUTE_ELEMENTS", "amax_tile", "Routing", "route", "route_local",
           "route_gather", "unpermute", "gather_rows", "triton_importable"]


# W4A16's step routes and gathers x's rows in one launch (routing_triton.route_gather_triton; False: the routing launch,
# then the gather's). Why (issue 41): in the Qwen3-like W4A16 layer at T = 1 (H200 profile, graph replay) the gather
# launch takes 2.1 us between the routing (1.6 us) and the gate/up GEMM, whose activations wait for it. Prediction
# (2026-11-29, before any run): W4A16 decode ~0.5-1 us faster on every layer (one chained launch fewer), T = 64 within 1
# us (its programs repeat a count over 512 ids). Outcome (H200, moe-bench --route-gather 0 1 0 1 --profile, W4A16,
# uniform; notebook 11's rounds): the first form let every program trigger at once and raced the GEMM, which reads the
# offsets before its wait (wrong at T <= 8: the run's reference check and the GPU tests found it). Fixed (program 0
# triggers after the offsets): within 1% at T <= 8 (Qwen3-like T = 1 23.9 -> 24.0 us, T = 8 70.1 -> 70.9, Mixtral-like T
# = 1 87.2 -> 86.7, DeepSeek-like T = 1 84.0 -> 83.4), T = 64 1-2 us faster (Qwen3-like 143.6 -> 141.9): the gate/up
# GEMM starts ~0.2 us sooner at T = 1 (2.1-2.3 -> 2.0 us), 1.5 us sooner at T = 64. The launch its trigger waits for is
# most of what the fused launch saves. The same bits (GPU tests; memcheck 0 errors). On: no slower within the run's
# noise, one launch fewer per step.
ROUTE_GATHER = True
# W4A4 with activation scales computed per call: the routing launch also finds amax(|x|) (one program, x at most
# AMAX_ROUTE_ELEMENTS as a padded tile), and the first quantization runs without its amax launch (route's amax_of,
# nn.moe). Why (issue 41): in the Qwen3-like W4A4 layer at T = 1 (H200 profile, graph replay) that amax launch takes
# 2.4-2.7 us in the chain between the routing and the quantization; static scales, which need no amax launch at all,
# measured 26.6 us against 29.3 for the layer (both amax launches gone).
# Prediction (2026-11-29, before any run): W4A4 decode ~1-1.5 us faster where x fits (Qwen3-like T <= 8, Mixtral-like
# T <= 4, DeepSeek-like T <= 2): Qwen3-like T = 1 ~29.3 -> ~28; larger steps unchanged. Outcome (H200, moe-bench
# --amax-in-route 0 1 0 1 --profile, W4A4, uniform; notebook 11's rounds): Qwen3-like T = 1 30.4 -> 30.1 us, T = 8
# 77.5 -> 76.8, Mixtral-like T = 1 91.9 -> 91.5, DeepSeek-like T = 1 88.1 -> 88.6 (one pair). The routing launch grew
# from 1.6 to 2.5 us (Qwen3-like T = 1), 4.9 (T = 8) and 4.0 (DeepSeek-like T = 1): one program walks x, and the
# first GEMM started only 0.6 us sooner at T = 1 and later at T = 8. The same bits (GPU tests; memcheck 0 errors).
# Off: within the runs' noise where it was meant to help, slower on the DeepSeek-like layer.
AMAX_IN_ROUTE = False


class Routing(NamedTuple):
    token: torch.Tensor  # int64 [T·k]: the token whose copy is packed row r (rows grouped by expert)
    offsets: torch.Tensor  # int32 [E+1]: expert e owns packed rows offsets[e] .. offsets[e+1]
    row: torch.Tensor  # int64 [T·k]: the packed row of copy t·k + j, i.e. the inverse permutation


@functools.cache
def triton_importable() -> bool:
    """Whether the triton package imports here (asked once per process: the layer's forward asks on every step)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _triton_form(t: torch.Tensor) -> bool:
    """Whether a step on ``t``'s device takes the one-launch Triton forms (:mod:`.routing_triton`): a CUDA tensor,
    Triton importable, not traced by torch.compile (which fuses the torch forms itself)."""
    return t.is_cuda and not torch.compiler.is_compiling() and triton_importable()


def route(topk_ids: torch.Tensor, experts: int, clear: torch.Tensor | None = None, amax_of=None) -> Routing:
    """Sort the ``T·k`` token copies of ``topk_ids [T, k]`` by expert (stable: within an expert, token order).
    Decode-sized steps on a CUDA device run :func:`.routing_triton.route_triton` (one launch, the same outputs).
    ``clear``: at most 16 contiguous int32 words to zero as well (in that launch where it runs, else by a fill).
    ``amax_of``: ``(x, word)`` with :func:`amax_tile` of x not None: amax(|x|)'s float32 bits written into the int32
    ``word`` as well (in that launch where it runs)."""
    if amax_of is not None and amax_tile(amax_of[0]) is None:
        raise ValueError(f"route: amax_of takes a 2-D x of whole 16-column blocks, at most {AMAX_ROUTE_ELEMENTS} "
                         f"elements as a padded tile; got {tuple(amax_of[0].shape)}")
    if _fits_triton(topk_ids, experts):
        from .routing_triton import route_triton

        return Routing(*route_triton(topk_ids, experts, clear=clear, amax_of=amax_of))
    if clear is not None:
        clear.zero_()
    if amax_of is not None:
        x, word = amax_of
        word.copy_(quant.amax_of(x).view(torch.int32))
    k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1).to(torch.int64)
    order = torch.argsort(ids, stable=True)
    # Offsets by binary search in the sorted ids rather than bincount: torch.bincount sizes its output from max(ids),
    # which reads a value back on CUDA and makes the shape data-dependent for torch.compile.
    bounds = torch.arange(experts + 1, dtype=torch.int64, device=ids.device)
    offsets = torch.searchsorted(ids.index_select(0, order), bounds, out_int32=True)
    # a scatter with distinct indices: deterministic, unlike a scatter-add of the outputs
    row = torch.empty_like(order).scatter_(0, order, torch.arange(ids.numel(), device=ids.device))
    return Routing(torch.div(order, k, rounding_mode="floor"), offsets, row)


def route_local(topk_ids: torch.Tensor, experts: int, base: int) -> Routing:
    """:func:`route` for the copies of experts ``[base, base + experts)`` only (an expert-parallel rank's own; the
    ids of the others, padding ids -1 among them, are any other value): their packed rows come first, grouped by
    local expert (``offsets [experts+1]``, ``offsets[experts]`` the copies this rank owns), every other copy after
    them with ``row`` -1 and ``token`` -1. ``topk_ids`` may have any row stride (the all-gather transport reads them
    in place from the gathered rows). On a CUDA device one launch where :func:`route`'s Triton form fits."""
    if _fits_triton(topk_ids, experts + 1):
        from .routing_triton import route_triton

        return Routing(*route_triton(topk_ids, experts, base))
    local = topk_ids.to(torch.int64) - base
    own = (local >= 0) & (local < experts)
    r = route(torch.where(own, local, experts), experts + 1)  # every other copy in a sink group after them
    packed = torch.arange(r.token.numel(), device=r.token.device)
    return Routing(torch.where(packed < r.offsets[experts], r.token, -1), r.offsets[:experts + 1],
                   torch.where(own.reshape(-1), r.row, -1))


def _fits_triton(topk_ids: torch.Tensor, groups: int) -> bool:
    if not _triton_form(topk_ids):
        return False
    from .routing_triton import _MAX_EXPERTS, ROUTE_MAX_COPIES

    return topk_ids.numel() <= ROUTE_MAX_COPIES and groups <= _MAX_EXPERTS


def route_gather(topk_ids: torch.Tensor, experts: int, x: torch.Tensor) -> tuple[Routing, torch.Tensor]:
    """(:func:`route`, ``x``'s rows in its packed order): :func:`route` then :func:`gather_rows`, in one launch on a
    CUDA device where the Triton routing fits and :data:`ROUTE_GATHER` is on
    (:func:`.routing_triton.route_gather_triton`: the same outputs)."""
    if ROUTE_GATHER and _fits_triton(topk_ids, experts):
        from .routing_triton import route_gather_triton

        token, offsets, row, rows = route_gather_triton(topk_ids, experts, x)
        return Routing(token, offsets, row), rows
    r = route(topk_ids, experts)
    return r, gather_rows(x, r.token)


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]``: the rows of a 2-D ``x`` in packed order, a row whose index is negative left unspecified; on a
    CUDA device one Triton launch (:func:`.routing_triton.gather_rows_triton`), else ``index_select``."""
    if _triton_form(x):
        from .routing_triton import gather_rows_triton

        return gather_rows_triton(x, index)
    return x.index_select(0, index.clamp(min=0))


def unpermute(y: torch.Tensor, routing: Routing, topk_weights: torch.Tensor,
              out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``out[t] = Σ_j topk_weights[t, j] · y[row of copy (t, j)]`` summed in fp32, ``[T, N]`` of ``out_dtype``: a
    gather then a fixed-order sum over j, so the result is deterministic (no atomics). On a CUDA device one launch
    (:func:`.routing_triton.unpermute_triton`)."""
    return weighted_rows(y, routing.row, topk_weights, out_dtype)


def weighted_rows(y: torch.Tensor, row: torch.Tensor, weights: torch.Tensor,
                  out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`unpermute` with the copies' rows given (int64 ``[T·k]``, copy (t, j) at ``t·k + j``): ``out[t] = Σ_j
    weights[t, j] · y[row[t·k + j]]`` in fp32, where a negative row adds ``0 · weights[t, j]`` (zero; NaN where the
    weight is NaN: how a caller marks a copy it lost). The expert-parallel combine weighs only its own copies so."""
    if _triton_form(y):
        from .routing_triton import unpermute_triton

        return unpermute_triton(y, row, weights, out_dtype)
    return weighted_rows_torch(y, row, weights, out_dtype)
