"""A one-shot grouped GEMM (new weights every call) in three launches and a handful of host operations.

``OneShot.run(table, ...)`` takes the address table of :mod:`.gather` (one int64 row per group: the caller's
activation and weight tensors, read in place), then launches the gather (weights packed, activation rows packed,
offsets and global scales: one Triton launch), the activation prologue and the device-scheduled GEMM (TVM-FFI). A
plan holds what does not depend on the call's data — the compiled kernels for (config, G, N, K_pad, out dtype) and
the activation scratch buffer — so that a call builds no Python object besides its outputs.
"""
from __future__ import annotations

import torch

from .config import NWG, ROW_BYTES, VarlenConfig
from .gather import F, Plan, run, views
from .kernel import kernel_classes
from .report import gemm_arguments, prologue_arguments
from .runner import OUT_DTYPES, POST_SCALE, Scratch, _compile, require_hopper

_PLANS: dict = {}


class OneShot:
    """The compiled kernels and the scratch buffer for one (config, G, N, K, out dtype) on one device."""

    def __init__(self, cfg: VarlenConfig, groups: int, n: int, k: int, out_dtype, device):
        require_hopper(device)
        self.cfg, self.groups, self.n, self.k, self.out_dtype, self.device = cfg, groups, n, k, out_dtype, device
        self.dual = cfg.dual
        self.n_pad = -(-n // cfg.tile_m) * cfg.tile_m
        self.k_pad = -(-k // cfg.tile_k) * cfg.tile_k
        self.blocks = cfg.tile_m * (2 if self.dual else 1) // (64 * NWG)
        pro_cls, gemm_cls = kernel_classes()
        out_name = OUT_DTYPES[out_dtype]
        g, kp = groups, self.k_pad
        self._gemm = _compile(("gemm", cfg, g, n, kp, out_name), lambda: gemm_cls(cfg, g, n, kp),
                              lambda: gemm_arguments(cfg, g, n, kp, out_name))
        self._prologue = _compile(("prologue",), pro_cls, prologue_arguments)
        self._x16 = Scratch(self.k_pad, device)
        self._plans: dict = {}  # rows -> gather plan (a serving loop repeats its row counts)

    @classmethod
    def get(cls, cfg: VarlenConfig, groups: int, n: int, k: int, out_dtype, device) -> "OneShot":
        key = (cfg.name, groups, n, k, out_dtype, device)
        plan = _PLANS.get(key)
        if plan is None:
            plan = _PLANS[key] = cls(cfg, groups, n, k, out_dtype, device)
        return plan

    def run(self, table: list[int], rows: int, *, swz_a: bool = False, swz_b: bool = False) -> torch.Tensor:
        """``table``: G·F ints (:data:`.gather.FIELDS` per group); ``rows``: T. Returns C ``[T, N]``."""
        plan = self._plans.get(rows)
        if plan is None:
            if len(self._plans) > 256:
                self._plans.clear()
            plan = self._plans[rows] = Plan(self.groups, self.n, self.k, self.n_pad, self.k_pad, NWG, self.blocks,
                                            self.dual, rows)
        # pinned: a pageable copy may wait for the stream (the GPU is still busy with the previous call)
        t = torch.tensor(plan.header + table, dtype=torch.int64, pin_memory=True).to(self.device, non_blocking=True)
        packed, small = run(t, plan, swz_a=swz_a, swz_b=swz_b, post=POST_SCALE)
        out = torch.empty((rows, self.n), dtype=self.out_dtype, device=self.device)
        if rows:
            a_codes, a_scales, offsets, gs_a, gs_b = views(small, plan)
            x16 = self._x16(rows)
            self._prologue(a_codes, a_scales, x16)
            self._gemm(packed.view(-1, ROW_BYTES), x16, out, offsets, gs_a, gs_b)
        return out


__all__ = ["OneShot", "F"]
