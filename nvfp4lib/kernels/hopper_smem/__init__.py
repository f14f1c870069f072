"""The smem-decode Hopper kernel (both operands decoded into shared memory) and the ``cute-hopper`` backend.

:mod:`.config` holds :class:`SmemConfig`, its budgets, :func:`validate` and the named configs; :mod:`.kernel`
the CuTe kernel, the backend's config table (this family's and :mod:`..hopper_rs`'s), :func:`prepare` and
:func:`compile_report`.
"""
from .config import SMEM_CONFIGS, SWEEP_CONFIGS, SmemConfig, smem_plan
from .kernel import CONFIGS, compile_report, get_config, grouped_gemm_raw, kernel_for, prepare, validate

__all__ = ["SMEM_CONFIGS", "SWEEP_CONFIGS", "SmemConfig", "smem_plan", "CONFIGS", "compile_report", "get_config",
           "grouped_gemm_raw", "kernel_for", "prepare", "validate"]
