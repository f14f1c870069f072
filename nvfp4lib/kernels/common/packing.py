"""The grouped layout the Hopper kernel reads: one tensor per operand, one TMA descriptor each.

All groups of a grouped GEMM run in one launch, so the kernel sees every group through a single
tensor per operand and a table of tiles:

- **Weights** (``B``, and ``B2`` for the dual GEMM), stacked once per weight set as a real MoE
  deployment would (:func:`stack_weights`): group g's codes ``[N_g, K_g/2]`` and E4M3 scale bytes
  ``[N_g, K_g/16]`` land at rows ``g*Np ...`` of ``[G*Np, Kp/2]`` / ``[G*Np, Kp/16]`` uint8, where
  ``Np``/``Kp`` are the largest N/K rounded up to the tile. The rest is zeros: a zero code and a
  zero scale contribute exactly zero, so the padding keeps the result exact.
- **Activations** (per call, :class:`ActivationPacker`): group g's rows start at ``row0[g]``, a
  multiple of ``tile_m``, in ``[R, Kp/2]`` / ``[R, Kp/16]``. The padding rows stay zero.
- **Output**: ``[R, Np]`` in the same row offsets, so a full output tile never reaches another
  group's rows (which is what makes a TMA-store epilogue safe on ragged groups); group g's result
  is the view ``C[row0[g]:row0[g]+M_g, :N_g]``.
- **Tile table** int32 ``[tiles, 8]`` (:data:`TILE_COLUMNS`): one row per output tile of every
  non-empty group; ``blockIdx.x`` picks its row. Rows of a tile beyond ``M_g`` (columns beyond
  ``N_g``) are computed from zero padding and never stored by the SIMT epilogue.
- **Global scales**: ``alpha[g] = gs_A[g] * gs_B[g] * 2**post`` (and for ``B2``), float32 ``[G, 2]``,
  applied to the fp32 accumulator; ``post`` undoes the exact power of two the decode folds into
  the 16-bit operands.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TILE_COLUMNS", "WIDE_TILE_COLUMNS", "split_ranges", "StackedWeights", "stack_weights",
           "ActivationPacker", "tile_table", "tile_fields", "padded_row_offsets", "round_up", "check_scales_finite"]

TILE_COLUMNS = ("group", "row0", "m_valid", "n0", "n_valid", "b_row0", "k_tiles", "pad")
WIDE_TILE_COLUMNS = TILE_COLUMNS + ("k_tile0", "out_row0")


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def padded_row_offsets(m, multiple: int) -> tuple[tuple[int, ...], int]:
    """Each group's first row when every group's rows are padded to ``multiple``, and the rows in all (at least
    ``multiple``, so that an all-empty problem still has one tile of rows)."""
    offs, r = [], 0
    for mg in m:
        offs.append(r)
        r += round_up(mg, multiple)
    return tuple(offs), max(r, multiple)


def tile_fields(tiles, i) -> dict:
    """Row ``i`` of a wide tile table as {column name: value}; in a kernel, ``tiles`` is the device tensor and the
    values are its loads (unused columns are never read once compiled)."""
    return {c: tiles[i, j] for j, c in enumerate(WIDE_TILE_COLUMNS)}


def check_scales_finite(ts, what: str) -> None:
    """E4M3 has one NaN pattern per sign (S.1111.111); refuse operands that carry it."""
    for g, t in enumerate(ts):
        s = t.scales.view(torch.uint8)
        bad = int(((s & 0x7F) == 0x7F).sum())
        if bad:
            raise ValueError(f"{what}[{g}] has {bad} NaN E4M3 block scale(s) (byte 0x7F/0xFF); "
                             "refusing to compute with them")


@dataclass
class StackedWeights:
    """Every group's weights stacked for the kernel (one or two weight matrices per group)."""

    codes: list[torch.Tensor]  # one [G*Np, Kp/2] uint8 per weight matrix
    scales: list[torch.Tensor]  # one [G*Np, Kp/16] uint8 (E4M3 bytes) per weight matrix
    global_scales: list[torch.Tensor]  # one float32 [G] per weight matrix
    n: tuple[int, ...]
    k: tuple[int, ...]
    n_pad: int
    k_pad: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() for t in self.codes + self.scales)


def stack_weights(weight_sets, tile_n: int, tile_k: int) -> StackedWeights:
    """Stack ``weight_sets`` (a list of weight matrices, each a list of NVFP4Tensor over groups)."""
    first = weight_sets[0]
    n = tuple(int(t.shape[0]) for t in first)
    k = tuple(int(t.shape[1]) for t in first)
    n_pad, k_pad = round_up(max(n), tile_n), round_up(max(k), tile_k)
    dev = first[0].data.device
    codes, scales, gss = [], [], []
    for i, wset in enumerate(weight_sets):
        check_scales_finite(wset, "b" if i == 0 else "b2")
        c = torch.zeros((len(wset) * n_pad, k_pad // 2), dtype=torch.uint8, device=dev)
        s = torch.zeros((len(wset) * n_pad, k_pad // 16), dtype=torch.uint8, device=dev)
        for g, t in enumerate(wset):
            c[g * n_pad: g * n_pad + n[g], : k[g] // 2] = t.data
            s[g * n_pad: g * n_pad + n[g], : k[g] // 16] = t.scales.view(torch.uint8)
        codes.append(c)
        scales.append(s)
        gss.append(torch.stack([t.global_scale.to(dev, torch.float32) for t in wset]))
    return StackedWeights(codes, scales, gss, n, k, n_pad, k_pad)


class ActivationPacker:
    """Per-call packing of the activations into the row-aligned layout (one scatter per operand).

    The buffers are allocated (zeroed) once; a call overwrites only the rows and columns that
    belong to a group, so padding rows and columns beyond ``K_g`` stay zero across calls."""

    def __init__(self, m, k, k_pad: int, tile_m: int, device):
        self.m = tuple(int(x) for x in m)
        self.k = tuple(int(x) for x in k)
        self.row_offsets, self.rows = padded_row_offsets(self.m, tile_m)
        self.k_pad = k_pad
        self.codes = torch.zeros((self.rows, k_pad // 2), dtype=torch.uint8, device=device)
        self.scales = torch.zeros((self.rows, k_pad // 16), dtype=torch.uint8, device=device)
        self.global_scales = torch.ones(len(self.m), dtype=torch.float32, device=device)
        self.same_k = len(set(self.k)) == 1
        rows = [torch.arange(o, o + mg) for o, mg in zip(self.row_offsets, self.m)]
        self.row_index = (torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)).to(device)

    def __call__(self, a) -> torch.Tensor:
        """Copy ``a`` (list of NVFP4Tensor) into the buffers; returns the float32 [G] global scales."""
        for g, t in enumerate(a):
            if int(t.shape[0]) != self.m[g] or int(t.shape[1]) != self.k[g]:
                raise ValueError(f"a[{g}] has shape {tuple(t.shape)}, but this runner was prepared for "
                                 f"[{self.m[g]}, {self.k[g]}]")
        nonempty = [t for t in a if t.shape[0] > 0]
        if self.same_k and nonempty:
            k2 = self.k[0] // 2
            codes = torch.cat([t.data for t in nonempty])
            scales = torch.cat([t.scales.view(torch.uint8) for t in nonempty])
            if k2 == self.k_pad // 2:
                self.codes.index_copy_(0, self.row_index, codes)
                self.scales.index_copy_(0, self.row_index, scales)
            else:
                self.codes[self.row_index, :k2] = codes
                self.scales[self.row_index, : k2 // 8] = scales
        else:
            for o, t in zip(self.row_offsets, a):
                if t.shape[0]:
                    self.codes[o: o + t.shape[0], : t.shape[1] // 2] = t.data
                    self.scales[o: o + t.shape[0], : t.shape[1] // 16] = t.scales.view(torch.uint8)
        torch.stack([t.global_scale.to(self.codes.device, torch.float32) for t in a], out=self.global_scales)
        return self.global_scales


def split_ranges(k_tiles: int, split_k: int) -> list[tuple[int, int]]:
    """(first K tile, K tiles) of each slice: ``split_k`` non-empty, balanced slices (``split_k`` <= ``k_tiles``)."""
    return [(s * k_tiles // split_k, (s + 1) * k_tiles // split_k - s * k_tiles // split_k) for s in range(split_k)]


def tile_table(m, n, k, row_offsets, n_pad: int, tile_m: int, tile_n: int, tile_k: int, device, *,
               split_k: int = 1, rows: int = 0, wide: bool = False) -> torch.Tensor:
    """int32 [tiles, 8], one row per output tile of every non-empty group (see TILE_COLUMNS).

    Within a group the M tiles of one N tile are adjacent, so CTAs that read the same weight tile
    (the operand that dominates the bytes) run close together and share it through L2.

    ``wide`` adds two columns (:data:`WIDE_TILE_COLUMNS`): the first K tile and the output row. With
    ``split_k`` > 1 every output tile becomes ``split_k`` rows, one per K slice (:func:`split_ranges`;
    ``split_k`` must not exceed any group's K tiles), whose output rows start at ``slice * rows + row0``
    in a workspace of ``split_k`` blocks of ``rows`` rows."""
    if split_k > 1 and not wide:
        raise ValueError("split_k > 1 needs the wide tile table (the K offset and output row columns)")
    out = []
    for g, (mg, ng, kg) in enumerate(zip(m, n, k)):
        kt = (kg + tile_k - 1) // tile_k
        if mg and ng and split_k > kt:
            raise ValueError(f"split_k={split_k} exceeds group {g}'s {kt} K tiles")
        for n0 in range(0, ng, tile_n):
            for m0 in range(0, mg, tile_m):
                base = (g, row_offsets[g] + m0, min(tile_m, mg - m0), n0, min(tile_n, ng - n0), g * n_pad + n0)
                if not wide:
                    out.append(base + (kt, 0))
                    continue
                for s, (k0, nk) in enumerate(split_ranges(kt, split_k)):
                    out.append(base + (nk, 0, k0, s * rows + row_offsets[g] + m0 if split_k > 1 else base[1]))
    width = len(WIDE_TILE_COLUMNS if wide else TILE_COLUMNS)
    if not out:
        return torch.zeros((0, width), dtype=torch.int32, device=device)
    return torch.tensor(out, dtype=torch.int32, device=device)
