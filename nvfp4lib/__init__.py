"""nvfp4lib: a research workbook on an NVFP4 block-scaled grouped GEMM (MoE experts, fused SwiGLU).

The public API:
- formats: ``quantize``, ``dequantize``, ``NVFP4Tensor``, ``swizzle_scales``, ``unswizzle_scales``;
- serving: ``prepare_weights`` (weights packed and compiled once; each call takes new activations and group
  offsets on the device, CUDA-graph and torch.compile safe);
- the grouped GEMMs: ``grouped_gemm``, ``grouped_dual_gemm_silu`` (``backend=`` picks the
  implementation: "reference", "cute-hopper", peers such as "torch-bf16" or "triton");
- problems and suites: ``GroupedProblem``, ``make_inputs``, ``BENCHMARK``, ``DUAL``, ``CORRECTNESS``.
Kernels (CuTe DSL), peers (Triton, torch) and the benchmark are imported lazily.
"""
from .api import grouped_dual_gemm_silu, grouped_gemm, prepare
from .backends import available_backends
from .formats import NVFP4Tensor, dequantize, quantize, swizzle_scales, unswizzle_scales
from .problems import BENCHMARK, CORRECTNESS, DUAL, GroupedProblem, get_problem, make_inputs
from .reference import reference_grouped_gemm, relative_error
from .serving import PreparedWeights, prepare_weights

__version__ = "0.1.0"

__all__ = [
    "NVFP4Tensor", "quantize", "dequantize", "swizzle_scales", "unswizzle_scales",
    "grouped_gemm", "grouped_dual_gemm_silu", "prepare", "prepare_weights", "PreparedWeights", "available_backends",
    "GroupedProblem", "make_inputs", "get_problem", "BENCHMARK", "DUAL", "CORRECTNESS",
    "reference_grouped_gemm", "relative_error",
]
