"""Kernel knobs: one frozen dataclass shared by the Hopper and Blackwell kernels.

Variants of a kernel are *configs*, never copies of its code. A config is named; the
name is what notebooks, data files and the CLI use.  Validity against a particular
architecture is checked by each kernel (``validate(config, arch)``) before compiling.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

Epilogue = Literal["simt", "tma"]
WarpSpec = Literal["none", "producer_consumer", "pingpong"]


@dataclass(frozen=True)
class KernelConfig:
    name: str
    tile_m: int = 128  # CTA tile rows of the output (tokens, or weights' N when swap_ab)
    tile_n: int = 128  # CTA tile columns of the output
    tile_k: int = 256  # K per pipeline stage, counted in FP4 elements
    ab_stages: int = 1  # stages of the packed A/B (+ scales) TMA pipeline
    epilogue: Epilogue = "simt"
    warp_spec: WarpSpec = "none"
    dual: bool = False  # fused silu(A·B1ᵀ) * (A·B2ᵀ)
    swap_ab: bool = False  # tokens on the MMA's N dimension (small-M path)
    # Hopper decode schedule: "chunked" (load, convert, store 16 codes at a time) or "batched" (all of a
    # thread's shared-memory loads for a 64-K sub-block first, then the conversions and stores).
    decode: str = "chunked"
    # split-K: K tiles of every output tile split over this many CTAs, fp32 partials summed on the host side;
    # 0 = chosen at prepare from the tile count (only when the tiles do not fill the GPU), 1 = off.
    split_k: int = 1
    # warp_spec="none" only: one warpgroup per 64 rows of the tile, each decoding its share and running the MMA of
    # its rows (more warps to hide the decode's latency, no producer/consumer hand-off)
    cooperative: bool = False
    # producer_consumer only: warpgroups that decode (the producers), each taking 32 rows per pass.
    decode_warpgroups: int = 1
    # swap_ab only: token tiles are rounded up to a multiple of this, and the kernel holds one wgmma N per multiple
    # up to tile_n (a tile of 40 tokens runs a 48-wide MMA with token_step=16); 0: every tile is tile_n wide.
    token_step: int = 0
    # swap_ab only: who decodes the activations. "prologue": a launch before the GEMM decodes them to fp16 once per
    # call (the GEMM loads them by TMA); "warpgroup": a third warpgroup in every CTA decodes its own token rows from
    # the caller's tensors into the fp16 ring and issues the weight loads (one launch, no prologue on the critical
    # path, each CTA re-decodes its rows).
    act_decode: str = "prologue"
    # Diagnostics, never shipped: "no_dequant" skips the decode, "no_mma" skips the wgmma. The result is
    # wrong by design; the benchmark times such a config without checking it and labels the row.
    ablate: str = ""
    # Blackwell-only knobs (ignored by the Hopper kernel)
    acc_stages: int = 1
    cluster_m: int = 1
    cluster_n: int = 1
    use_2cta: bool = False

    def with_(self, **changes) -> "KernelConfig":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)
