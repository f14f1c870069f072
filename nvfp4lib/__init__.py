"""nvfp4lib: a research workbook on an NVFP4 block-scaled grouped GEMM (MoE experts, fused SwiGLU).

The public API:
- formats: ``quantize``, ``dequantize``, ``NVFP4Tensor``, ``swizzle_scales``, ``unswizzle_scales``;
- serving: ``prepare_weights`` (weights packed and compiled once; each call takes new activations and group
  offsets on the device, CUDA-graph and torch.compile safe);
- one-shot grouped GEMMs (new weights each call): ``grouped_gemm``, ``grouped_dual_gemm_silu`` (``backend=``
  "reference", the exact semantics on any device, or "cute-hopper", the serving kernel on an sm_90 GPU);
- problems and suites: ``GroupedProblem``, ``make_inputs``, ``BENCHMARK``, ``DUAL``, ``CORRECTNESS``.
The layers: this core; :mod:`nvfp4lib.bench` (harness, peers, roofline, results store), which imports the core;
:mod:`nvfp4lib.study` (what the notebooks compute and plot, the command line), which imports both. Kernels (CuTe DSL)
are imported lazily.
"""
from ._version import __version__
from .api import grouped_dual_gemm_silu, grouped_gemm
from .formats import NVFP4Tensor, dequantize, quantize, swizzle_scales, unswizzle_scales
from .problems import BENCHMARK, CORRECTNESS, DUAL, GroupedProblem, get_problem, make_inputs
from .reference import reference_grouped_gemm, relative_error
from .serving import PreparedWeights, prepare_weights

__all__ = [
    "NVFP4Tensor", "quantize", "dequantize", "swizzle_scales", "unswizzle_scales",
    "grouped_gemm", "grouped_dual_gemm_silu", "prepare_weights", "PreparedWeights",
    "GroupedProblem", "make_inputs", "get_problem", "BENCHMARK", "DUAL", "CORRECTNESS",
    "reference_grouped_gemm", "relative_error", "__version__",
]
