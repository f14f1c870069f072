import pytest
import torch
import torch.nn.functional as F

import nvfp4lib
from nvfp4lib import dequantize, get_problem, grouped_dual_gemm_silu, grouped_gemm, make_inputs, quantize
from nvfp4lib.reference import reference_grouped_gemm, relative_error


def _naive(a, b):
    # A different route to the same numbers: fp64 dequantize, row-by-row dot products.
    A = dequantize(a, torch.float64)
    B = dequantize(b, torch.float64)
    return torch.stack([B @ A[i] for i in range(A.shape[0])]) if A.shape[0] else torch.zeros(0, B.shape[0],
                                                                                              dtype=torch.float64)


@pytest.mark.parametrize("name", ["C1", "C4", "C9", "E1-empty-group", "E3-ragged"])
@pytest.mark.parametrize("mode", ["uniform", "gaussian"])
def test_reference_matches_a_naive_fp64_product(name, mode):
    inp = make_inputs(get_problem(name), seed=7, mode=mode)
    out = grouped_gemm(inp.a, inp.b, out_dtype=torch.float32)
    for g, o in enumerate(out):
        want = _naive(inp.a[g], inp.b[g])
        assert o.shape == want.shape
        if want.numel():
            assert torch.allclose(o.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_dual_is_silu_times_up():
    inp = make_inputs(get_problem("C4").with_dual(), seed=2, mode="gaussian")
    out = grouped_dual_gemm_silu(inp.a, inp.b, inp.b2, out_dtype=torch.float32)
    for g, o in enumerate(out):
        want = F.silu(_naive(inp.a[g], inp.b[g])) * _naive(inp.a[g], inp.b2[g])
        assert torch.allclose(o.double(), want, rtol=1e-4, atol=1e-6)


def test_fp16_output_is_one_rounding_of_the_fp32_result():
    inp = make_inputs(get_problem("C1"), seed=1, mode="uniform")
    f16 = grouped_gemm(inp.a, inp.b)
    f32 = grouped_gemm(inp.a, inp.b, out_dtype=torch.float32)
    assert all(torch.equal(x, y.half()) for x, y in zip(f16, f32))


def test_fp64_accumulation_on_request():
    inp = make_inputs(get_problem("C2"), seed=1, mode="uniform")
    r32 = reference_grouped_gemm(inp.a, inp.b, out_dtype=torch.float64)
    r64 = reference_grouped_gemm(inp.a, inp.b, out_dtype=torch.float64, accumulate=torch.float64)
    assert relative_error(r32, r64) < 1e-6
    # uniform inputs are multiples of 0.5 times scales 1 or 2: products, and their fp64 sums, are exact quarters
    assert all(torch.equal(x, torch.round(x * 4) / 4) for x in r64)


def test_empty_group_gives_empty_output():
    inp = make_inputs(get_problem("E1-empty-group"), seed=1)
    out = grouped_gemm(inp.a, inp.b)
    assert out[0].shape == (0, 256) and out[2].shape == (0, 256)


def test_global_scales_multiply_the_product():
    x = torch.randn(8, 64)
    w = torch.randn(16, 64)
    a = quantize(x, global_scale=0.5)
    b = quantize(w, global_scale=0.25)
    out = grouped_gemm([a], [b], out_dtype=torch.float32)[0]
    want = dequantize(a) @ dequantize(b).T
    assert torch.allclose(out, want, rtol=1e-5, atol=1e-5)


def _pair(m=8, n=16, k=64):
    return quantize(torch.randn(m, k)), quantize(torch.randn(n, k))


def test_bad_input_is_named():
    a, b = _pair()
    with pytest.raises(ValueError, match="K mismatch"):
        grouped_gemm([a], [quantize(torch.randn(16, 32))])
    with pytest.raises(TypeError, match="list of NVFP4Tensor"):
        grouped_gemm(a, [b])
    with pytest.raises(TypeError, match=r"a\[0\] must be an NVFP4Tensor"):
        grouped_gemm([torch.randn(8, 64)], [b])
    with pytest.raises(ValueError, match="at least one group"):
        grouped_gemm([], [])
    with pytest.raises(ValueError, match="b has 2 groups but a has 1"):
        grouped_gemm([a], [b, b])
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        grouped_gemm([a], [b], backend="nope")
    with pytest.raises(TypeError, match="out_dtype"):
        grouped_gemm([a], [b], out_dtype=torch.int32)
    with pytest.raises(TypeError, match="needs b2"):
        grouped_dual_gemm_silu([a], [b], None)
    with pytest.raises(ValueError, match="N="):
        grouped_dual_gemm_silu([a], [b], [quantize(torch.randn(8, 64))])


def test_unrunnable_backends_refuse_clearly_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    a, b = _pair(8, 128, 256)
    with pytest.raises((RuntimeError, ValueError), match="(?i)cuda|gpu|device"):
        grouped_gemm([a], [b], backend="cute-hopper")


def test_public_names():
    for name in ["quantize", "dequantize", "NVFP4Tensor", "swizzle_scales", "unswizzle_scales",
                 "grouped_gemm", "grouped_dual_gemm_silu"]:
        assert hasattr(nvfp4lib, name)
