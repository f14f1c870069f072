"""nvfp4lib.nn: torch modules built on the serving path.

- :class:`NVFP4MoE` (:mod:`.moe`): an MoE expert layer with NVFP4 weights, routing to un-permute on the device;
- :func:`quantize_rows` (:mod:`.quant`): activations to NVFP4 without a host synchronisation;
- :func:`reference_moe` (:mod:`.reference`): the layer's exact semantics, to test against;
- :mod:`.hf` (needs ``transformers``, imported on use): ``swap_moe_blocks`` for Mixtral and Qwen3-MoE models.
"""
from .moe import NVFP4MoE
from .quant import global_scale_of, quantize_rows
from .reference import reference_moe

__all__ = ["NVFP4MoE", "quantize_rows", "global_scale_of", "reference_moe"]
