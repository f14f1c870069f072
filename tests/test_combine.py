"""The GEMM then the weighted un-permute in one launch (``PreparedWeights.combine``) without a GPU: the kernel compiles
for sm_90a with what it claims (the column blocks' count, the L2 reads of the GEMM's rows, the fp32 fused multiply-adds;
the plain GEMM's wgmma), a dual config is refused, and the reference backend's form is the call then the sum, with its
errors. The kernel itself is checked on the GPU (tests/gpu/test_moe_gpu.py: the same bits as the two launches)."""
import re

import pytest
import torch

from nvfp4lib.formats import quantize
from nvfp4lib.kernels.hopper_varlen.config import CONFIGS
from nvfp4lib.serving import prepare_weights, weighted_rows_torch


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vl_a16_m128_t16_k128_s8_e_x", "vl_m128_t16_k128_s8_e_x"])
def test_the_combine_compiles_for_sm90a(name, tmp_path, monkeypatch):
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.common.compiling import compile_offline
    from nvfp4lib.kernels.hopper_varlen import runner
    from nvfp4lib.kernels.hopper_varlen.report import TVM_FFI

    cfg = CONFIGS[name]
    k = 768 if cfg.act == "bf16" else None
    arts = {}
    for kind in ("varlen-gemm", "varlen-combine"):
        make, args = runner._parts(kind, cfg, 128, 2048, 768, "BFloat16", k=k, combine_out="Float32", top_k=8)
        arts[kind] = compile_offline(make(), *args(), arch="sm_90a", dump_dir=str(tmp_path / kind), ptxas=False,
                                     extra_options=TVM_FFI).ptx
    plain, ptx = arts["varlen-gemm"], arts["varlen-combine"]
    assert ptx.count(".entry") == 1
    assert len(re.findall(r"wgmma\.mma_async", ptx)) == len(re.findall(r"wgmma\.mma_async", plain))
    # the rows counted in at the column block's word (the split-K tiles count CTAs: add 1), read back from L2, summed
    assert len(re.findall(r"atom\.acq_rel\.gpu\.global\.add\.u32 \S+, \[\S+\], %r\d+;", ptx)) == 1
    assert "ld.relaxed.gpu.global.b16" in ptx and "fma.rn.f32" in ptx
    assert not re.search(r"atom\.acq_rel\.gpu\.global\.add\.u32 \S+, \[\S+\], %r\d+;", plain)
    assert "ld.relaxed.gpu.global.b16" not in plain


def test_a_dual_gemm_has_no_combine():
    pytest.importorskip("cutlass")
    from nvfp4lib.kernels.hopper_varlen.kernel import kernel_classes

    with pytest.raises(ValueError, match="not a dual one"):
        kernel_classes()[1](CONFIGS["vl_dual_m64_t16_k128_s8_e_x"], 8, 768, 2048, combine=2)


def _routing(t, k, rows_per_copy):
    """row [t·k] (some copies lost: -1) and weights [t, k]."""
    g = torch.Generator().manual_seed(t * 31 + k)
    row = torch.randperm(rows_per_copy, generator=g)[: t * k].to(torch.int64)
    row[::5] = -1
    return row, torch.rand(t, k, generator=g)


@pytest.mark.parametrize("activations", ["bf16", "nvfp4"])
def test_the_reference_backend_combines_as_the_call_then_the_sum(activations):
    torch.manual_seed(0)
    b = [quantize(torch.randn(64, 128)) for _ in range(3)]
    w = prepare_weights(b, backend="reference", activations=activations, out_dtype=torch.bfloat16)
    t, k = 3, 4
    rows = t * k
    offsets = torch.tensor([0, 5, 5, rows], dtype=torch.int32)
    row, weights = _routing(t, k, rows)
    if activations == "bf16":
        a = torch.randn(rows, 128).to(torch.bfloat16)
        c, kw = w(a, offsets), {}
    else:  # the fp16 operand: e2m1 · block scale · 2^-7
        a = (torch.randint(-6, 7, (rows, 128)).float() / 128).to(torch.float16)
        g = torch.full((1,), 0.5)
        c, kw = w.call_operand(a, offsets, g), {"global_scale": g}
    got = w.combine(a, offsets, row, weights.to(torch.bfloat16), out_dtype=torch.float32, **kw)
    assert torch.equal(got, weighted_rows_torch(c, row, weights.to(torch.bfloat16).float(), torch.float32))
    assert got.shape == (t, 64) and got.dtype == torch.float32
    assert torch.equal(got[0], sum(weights[0, j].to(torch.bfloat16).float() * c[row[j]].float()
                                   for j in range(k) if row[j] >= 0) + 0 * got[0])


def test_combine_names_what_is_wrong():
    torch.manual_seed(0)
    b = [quantize(torch.randn(64, 128)) for _ in range(2)]
    w = prepare_weights(b, backend="reference", activations="bf16", out_dtype=torch.bfloat16)
    a, offsets = torch.randn(4, 128).to(torch.bfloat16), torch.tensor([0, 2, 4], dtype=torch.int32)
    row, weights = torch.arange(4), torch.ones(2, 2)
    with pytest.raises(TypeError, match="row must be an int64"):
        w.combine(a, offsets, row.to(torch.int32), weights)
    with pytest.raises(ValueError, match="T·k = 4"):
        w.combine(a, offsets, row, torch.ones(3, 2))
    with pytest.raises(TypeError, match="out_dtype"):
        w.combine(a, offsets, row, weights, out_dtype=torch.int8)
    dual = prepare_weights(b, b, backend="reference", activations="bf16")
    with pytest.raises(TypeError, match="these weights are dual"):
        dual.combine(a, offsets, row, weights)
