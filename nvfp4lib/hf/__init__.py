"""nvfp4lib.hf: NVFP4 checkpoints (ModelOpt, compressed-tensors) in, tokens out (needs ``transformers`` and
``safetensors``, the ``hf`` extra; imported on use).

- :func:`from_pretrained` (:mod:`.loader`): a checkpoint folder -> a transformers causal LM whose experts are
  :class:`~nvfp4lib.nn.NVFP4MoE` and other quantized Linears :class:`~nvfp4lib.nn.NVFP4Linear`; with ``ep_group``,
  each rank's own experts as :class:`~nvfp4lib.nn.EPMoE` (expert parallelism, :mod:`.ep`);
- :func:`make_checkpoint` (:mod:`.writer`): a randomly initialised NVFP4 checkpoint in either format;
- :func:`generate` (:mod:`.generate`): greedy decoding with a static KV cache (optionally one CUDA graph per step),
  timed;
- :mod:`.checkpoint`: the formats on disk; :mod:`.archs`: the architectures and their tensor names;
  :mod:`.cli`: the ``make-checkpoint`` and ``generate`` commands.
"""
from .checkpoint import CheckpointError
from .generate import generate
from .loader import from_pretrained
from .writer import make_checkpoint

__all__ = ["from_pretrained", "make_checkpoint", "generate", "CheckpointError"]
