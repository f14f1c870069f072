"""nvfp4lib.nn: torch modules built on the serving path.

- :class:`NVFP4MoE` (:mod:`.moe`): an MoE expert layer with NVFP4 weights, routing to un-permute on the device;
- :class:`NVFP4Linear` (:mod:`.linear`): one NVFP4 weight on the serving path (W4A4 with a static or per-call
  activation scale, or W4A16);
- :class:`EPMoE` (:mod:`.ep`): the layer's experts split over a process group (expert parallelism), with the
  all-gather transport or the symmetric-memory all-to-all (:mod:`.ep_symm`, GPU only; its step in four Triton
  launches: :mod:`.ep_symm_triton`);
- :func:`quantize_rows` (:mod:`.quant`): activations to NVFP4 without a host synchronisation;
- :func:`reference_moe` (:mod:`.reference`): the layer's exact semantics, to test against;
- :mod:`.compiled`: the modules as opaque custom ops under ``torch.compile``;
- :mod:`.hf` (needs ``transformers``, imported on use): ``swap_moe_blocks`` for Mixtral and Qwen3-MoE models.
"""
from . import compiled  # noqa: F401  (registers the nvfp4lib::moe and nvfp4lib::linear ops)
from .ep import EPMoE
from .linear import NVFP4Linear
from .moe import NVFP4MoE
from .quant import global_scale_of, quantize_rows
from .reference import calibrate_input_scales, reference_moe

__all__ = ["NVFP4MoE", "EPMoE", "NVFP4Linear", "quantize_rows", "global_scale_of", "reference_moe",
           "calibrate_input_scales"]
