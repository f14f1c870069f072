"""The grouped layout the CuTe kernels read: one tensor per operand, one TMA descriptor each.

- Weights (prepacked once per weight set, as MoE deployments do): every group's ``[N_g, K_g]``
  codes and scales stacked into ``[G * Np, Kp/2]`` / ``[G * Np, Kp/16]`` (Np, Kp: the largest N,
  K rounded up to the tile), zero-padded. Zero codes and zero scales contribute exactly zero, so
  padding keeps the result exact.
- Activations (per call): group g's rows start at a multiple of ``tile_m`` in ``[Mpad, Kp/2]``.
- A tile table ``int32 [tiles, 8]``: (group, first A row, valid rows, n0, valid columns,
  first B row, K tiles, 0) — the per-group problem sizes the single launch schedules from.
- Global scales: ``alpha[g] = gs_A[g] * gs_B[g]`` (and the same for B2), applied in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import NVFP4Tensor

TILE_COLUMNS = ("group", "a_row0", "m_valid", "n0", "n_valid", "b_row0", "k_tiles", "pad")


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _check_scales_finite(ts: list[NVFP4Tensor], what: str) -> None:
    for g, t in enumerate(ts):
        s = t.scales.view(torch.uint8)
        bad = int(((s & 0x7F) == 0x7F).sum())
        if bad:
            raise ValueError(f"{what}[{g}] has {bad} NaN E4M3 block scale(s); refusing to compute with them")


@dataclass
class PackedWeights:
    """Weights of every group stacked for the kernel (B, and B2 for the dual GEMM)."""

    codes: list[torch.Tensor]  # one [G*Np, Kp/2] uint8 per weight matrix (1 or 2)
    scales: list[torch.Tensor]  # one [G*Np, Kp/16] uint8 per weight matrix
    global_scales: list[torch.Tensor]  # one float32 [G] per weight matrix
    n: tuple[int, ...]
    k: tuple[int, ...]
    n_pad: int
    k_pad: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() for t in self.codes + self.scales)


def pack_weights(weights: list[list[NVFP4Tensor]], tile_n: int, tile_k: int) -> PackedWeights:
    """Stack ``weights`` (a list of weight sets, each a list over groups) into the kernel layout."""
    first = weights[0]
    n = tuple(t.shape[0] for t in first)
    k = tuple(t.shape[1] for t in first)
    n_pad, k_pad = _round_up(max(n), tile_n), _round_up(max(k), tile_k)
    dev = first[0].data.device
    codes, scales, gss = [], [], []
    for i, wset in enumerate(weights):
        _check_scales_finite(wset, "b" if i == 0 else "b2")
        c = torch.zeros((len(wset) * n_pad, k_pad // 2), dtype=torch.uint8, device=dev)
        s = torch.zeros((len(wset) * n_pad, k_pad // 16), dtype=torch.uint8, device=dev)
        for g, t in enumerate(wset):
            c[g * n_pad: g * n_pad + n[g], : k[g] // 2] = t.data
            s[g * n_pad: g * n_pad + n[g], : k[g] // 16] = t.scales.view(torch.uint8)
        codes.append(c)
        scales.append(s)
        gss.append(torch.stack([t.global_scale.to(dev, torch.float32) for t in wset]))
    return PackedWeights(codes, scales, gss, n, k, n_pad, k_pad)


@dataclass
class PackedActivations:
    codes: torch.Tensor  # [Mpad, Kp/2] uint8
    scales: torch.Tensor  # [Mpad, Kp/16] uint8
    global_scales: torch.Tensor  # float32 [G]
    row_offsets: tuple[int, ...]
    m: tuple[int, ...]


class ActivationPacker:
    """Per-call packing of the activations into the kernel's row-aligned layout (one scatter per operand)."""

    def __init__(self, m: tuple[int, ...], k_pad: int, tile_m: int, device):
        self.m = m
        offs, r = [], 0
        for mg in m:
            offs.append(r)
            r += _round_up(mg, tile_m)
        self.row_offsets = tuple(offs)
        self.rows = max(r, tile_m)
        idx = [torch.arange(o, o + mg) for o, mg in zip(offs, m)]
        self.row_index = torch.cat(idx).to(device) if idx else torch.zeros(0, dtype=torch.long, device=device)
        self.codes = torch.zeros((self.rows, k_pad // 2), dtype=torch.uint8, device=device)
        self.scales = torch.zeros((self.rows, k_pad // 16), dtype=torch.uint8, device=device)

    def __call__(self, a: list[NVFP4Tensor]) -> PackedActivations:
        k2 = a[0].data.shape[1]
        same_k = all(t.data.shape[1] == k2 for t in a)
        if same_k:
            # one gather per operand: rows of every group into their aligned slots
            self.codes[self.row_index, :k2] = torch.cat([t.data for t in a])
            self.scales[self.row_index, : k2 // 8] = torch.cat([t.scales.view(torch.uint8) for t in a])
        else:
            for o, t in zip(self.row_offsets, a):
                self.codes[o: o + t.shape[0], : t.shape[1] // 2] = t.data
                self.scales[o: o + t.shape[0], : t.shape[1] // 16] = t.scales.view(torch.uint8)
        gs = torch.stack([t.global_scale.to(self.codes.device, torch.float32) for t in a])
        return PackedActivations(self.codes, self.scales, gs, self.row_offsets, self.m)


def tile_table(m, n, k, row_offsets, n_pad, tile_m, tile_n, tile_k, device) -> torch.Tensor:
    """int32 [tiles, 8]: one row per output tile of every non-empty group (see TILE_COLUMNS)."""
    rows = []
    for g, (mg, ng, kg) in enumerate(zip(m, n, k)):
        kt = (kg + tile_k - 1) // tile_k
        for m0 in range(0, mg, tile_m):
            for n0 in range(0, ng, tile_n):
                rows.append((g, row_offsets[g] + m0, min(tile_m, mg - m0), n0, min(tile_n, ng - n0),
                             g * n_pad + n0, kt, 0))
    if not rows:
        return torch.zeros((0, 8), dtype=torch.int32, device=device)
    return torch.tensor(rows, dtype=torch.int32, device=device)
