"""The register-decode kernel for serving: prepared weights, group offsets on the device, one-shot gather.

:mod:`.config` (:class:`VarlenConfig`, :func:`validate`, the ``vl_*`` configs), :mod:`.gather` (the Triton
gather of one-shot calls), :mod:`.kernel` (the prologue and the device scheduler, on :mod:`..hopper_rs.mainloop`'s
tile), :mod:`.report` (compile reports), :mod:`.runner`
(prepared weights and the runner) and :mod:`.oneshot` (gather and GEMM in one call).
"""
from .config import CONFIGS, VarlenConfig, get_config, max_token_tiles, validate
from .runner import PackedWeights, VarlenRunner, layout_of

__all__ = ["CONFIGS", "VarlenConfig", "get_config", "max_token_tiles", "validate", "PackedWeights", "VarlenRunner",
           "layout_of"]
