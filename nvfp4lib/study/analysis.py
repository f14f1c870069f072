"""Quantities the round notebooks compute from shapes and configs (no GPU): tiles, waste, work.

These test the panel's arithmetic claims ("M=40 on a 128-row tile wastes 69%", "16-64 CTAs on
144 SMs") and give simple models whose predictions the measurements then confirm or refute.
"""
from __future__ import annotations

import math
from typing import Protocol

from ..problems import GroupedProblem


class KernelConfig(Protocol):
    """What these models read of a config: its output tile and K tile (any family's config has them)."""

    tile_m: int
    tile_n: int
    tile_k: int


def tiles(problem: GroupedProblem, cfg: KernelConfig) -> int:
    """CTAs of the one grouped launch: one per output tile of every group."""
    return sum(math.ceil(m / cfg.tile_m) * math.ceil(n / cfg.tile_n) for m, n in zip(problem.m, problem.n))


def mma_waste(problem: GroupedProblem, cfg: KernelConfig) -> float:
    """Fraction of the MMA work spent on padding rows/columns of partial tiles."""
    useful = sum(m * n for m, n in zip(problem.m, problem.n))
    done = sum(math.ceil(m / cfg.tile_m) * cfg.tile_m * math.ceil(n / cfg.tile_n) * cfg.tile_n
               for m, n in zip(problem.m, problem.n))
    return 1 - useful / done


def k_iterations(problem: GroupedProblem, cfg: KernelConfig) -> list[int]:
    return [math.ceil(k / cfg.tile_k) for k in problem.k]


def dequant_elements(problem: GroupedProblem, cfg: KernelConfig) -> int:
    """Elements dequantized over the launch: each CTA decodes its A tile and its B tile(s) at every K step."""
    nb = problem.n_b
    return sum(math.ceil(m / cfg.tile_m) * math.ceil(n / cfg.tile_n) * (cfg.tile_m + nb * cfg.tile_n) * k
               for m, n, k in zip(problem.m, problem.n, problem.k))


def waves(problem: GroupedProblem, cfg: KernelConfig, sms: int = 132, ctas_per_sm: int = 1) -> float:
    return tiles(problem, cfg) / (sms * ctas_per_sm)
