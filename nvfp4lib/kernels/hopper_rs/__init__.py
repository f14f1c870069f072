"""The register-decode (swap-AB) Hopper kernel: weights decoded straight into wgmma's register operand.

:mod:`.config` (:class:`RSConfig`, budgets, :func:`validate`, the ``rs_*`` configs), :mod:`.layout` (weight
prepack and the decode PTX of a prepacked unit), :mod:`.ops` (the inline-PTX operations and activation constants),
:mod:`.prologue` (the activation-decode prologue), :mod:`.mainloop` (the tile both swap-AB kernels run once a CTA
knows its tile: producer, decode and MMA, pipeline, epilogue), :mod:`.kernel` (the host-scheduled kernel classes)
and :mod:`.runner` (token-tile planning, :func:`prepare`, compile reports).
"""
from .config import RS_CONFIGS, RSConfig, smem_plan, validate
from .layout import prepack_weights
from .runner import compile_report, kernel_for, plan_token_tiles, prepare, prologue_report

__all__ = ["RS_CONFIGS", "RSConfig", "smem_plan", "validate", "prepack_weights", "compile_report", "kernel_for",
           "plan_token_tiles", "prepare", "prologue_report"]
