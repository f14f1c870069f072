"""The decode path's GEMVs (kernels/hopper_varlen/gemv_triton.py, nn/moe_gemv.py) on weights packed as the serving
kernel packs them, against the exact reference layer (Triton's interpreter on the CPU; skipped where Triton is
missing)."""
import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1", allow_module_level=True)

from nvfp4lib.formats import quantize  # noqa: E402
from nvfp4lib.kernels.hopper_rs.layout import a16_units  # noqa: E402
from nvfp4lib.kernels.hopper_varlen.gemv_triton import GemvWeights, combine, finalize, gemv  # noqa: E402
from nvfp4lib.kernels.hopper_varlen.runner import pack_torch  # noqa: E402
from nvfp4lib.nn import reference_moe  # noqa: E402
from nvfp4lib.nn.moe_gemv import gemv_moe, pick_split  # noqa: E402
from nvfp4lib.nn.quant import quantize_rows  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _packed(mats, tile_m, dual, own=None):
    """GemvWeights of NVFP4Tensor lists (one, or gate and up), packed as PackedWeights packs them (torch form); with
    ``own`` (True/False) as it packs them for bf16 activations (own word layout or not)."""
    n, k = mats[0][0].shape
    n_pad, k_pad = -(-n // tile_m) * tile_m, -(-k // 128) * 128
    packed, gs_b = pack_torch(mats[0], mats[1] if dual else None, n_pad, k_pad, tile_m * (2 if dual else 1) // 128)
    if own is not None:
        a16_units(packed, own)
    return GemvWeights(packed.to(DEV).view(-1, 128), gs_b.to(DEV), n, k, k_pad, tile_m, dual, len(mats[0]), bool(own))


def _layer(e, h, i, seed, zero_expert=None):
    g = torch.Generator().manual_seed(seed)

    def mat(n, k, scale):
        w = torch.randn(n, k, generator=g) * scale
        return quantize(w.to(torch.bfloat16))

    gate = [mat(i, h, 0.05 * (1 + j)) for j in range(e)]
    up = [mat(i, h, 0.04) for _ in range(e)]
    down = [mat(h, i, 0.03) for _ in range(e)]
    if zero_expert is not None:  # an expert whose codes are all zero blocks
        gate[zero_expert] = quantize(torch.zeros(i, h, dtype=torch.bfloat16))
    return gate, up, down


def _routing(t, k, e, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w = torch.softmax(torch.randn(t, k, generator=g), dim=-1)
    return ids, w


CASES = [
    (8, 2, 256, 192, 1, 64, 128),   # K not a multiple of tile_k (192 -> 256 padded), N not of tile_m
    (6, 3, 128, 128, 3, 128, 256),  # four units per block (dual m128, single m256)
    (16, 4, 192, 64, 2, 64, 128),
]


def _case(e, k, h, i, t, gate_tile, down_tile, own=None):
    ids, w = _routing(t, k, e, seed=t + i)
    gate, up, down = _layer(e, h, i, seed=e * 7 + h, zero_expert=int(ids[0, 0]))  # a used expert of zero codes
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    return (ids, w, x, (gate, up, down), _packed([gate, up], gate_tile, True, own),
            _packed([down], down_tile, False, own))


@pytest.mark.parametrize("case", CASES)
def test_w4a16_layer_matches_the_reference(case):
    """On the weights as packed for NVFP4 activations, and as for bf16 activations: canonical (the same products and
    sums, so the same bits) and with the code words in W4A16's own layout (the same products; the kernel reads words,
    so the compiled reductions may add in another order: equal up to that)."""
    ids, w, x, mats, gu, dn = _case(*case)
    ref = reference_moe(x, ids, w, *mats, activations="bf16")
    out = gemv_moe(x.to(DEV), ids.to(DEV), w.to(DEV), gu, dn, out_dtype=torch.float32).cpu()
    assert float((out - ref).norm() / ref.norm()) < 1e-2  # the bench's tolerance: bf16 rounding of the intermediate
    for own in (False, True):
        *_, gu, dn = _case(*case, own=own)
        assert gu.own_words == own and dn.own_words == own
        got = gemv_moe(x.to(DEV), ids.to(DEV), w.to(DEV), gu, dn, out_dtype=torch.float32).cpu()
        if own:
            torch.testing.assert_close(got, out, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(got, out)


@pytest.mark.parametrize("case", CASES)
def test_w4a4_layer_is_exact_on_its_quantized_operands(case):
    """Each GEMV against the dequantized operands it was given (exact up to the order of fp32 sums): x quantized per
    call, then the intermediate as the layer quantizes it. (Against reference_moe a one-ulp change of an fp32 sum can
    flip an intermediate block's NVFP4 rounding, so the whole layer is checked stage by stage.)"""
    from nvfp4lib.formats import NVFP4Tensor, dequantize

    ids, w, x, (gate, up, down), gu, dn = _case(*case)
    t, k = ids.shape
    codes, scales, g = quantize_rows(x, None)
    xq = dequantize(NVFP4Tensor(codes, scales, g.reshape(())), torch.float32)
    part = gemv(gu, ids.to(DEV), codes.to(DEV), act_scales=scales.to(DEV), act_gs=g.to(DEV), split=2).sum(0).cpu()
    h = finalize(part.unsqueeze(0).to(DEV)).cpu()
    c2, s2, g2 = quantize_rows(h, None)
    hq = dequantize(NVFP4Tensor(c2, s2, g2.reshape(())), torch.float32)
    y = gemv(dn, ids.to(DEV), c2.to(DEV), act_scales=s2.to(DEV), act_gs=g2.to(DEV), split=1)[0].cpu()
    for r in range(t * k):
        e = int(ids.view(-1)[r])
        torch.testing.assert_close(part[r, 0], xq[r // k] @ dequantize(gate[e], torch.float32).T, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(part[r, 1], xq[r // k] @ dequantize(up[e], torch.float32).T, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y[r], hq[r] @ dequantize(down[e], torch.float32).T, rtol=1e-5, atol=1e-5)
    quant = lambda rows, gs: quantize_rows(rows, gs)  # noqa: E731
    out = gemv_moe(x.to(DEV), ids.to(DEV), w.to(DEV), gu, dn, quantize=quant, out_dtype=torch.float32).cpu()
    want = (y.view(t, k, -1) * w.unsqueeze(-1)).sum(1)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_split_k_gives_the_unsplit_sums():
    gate, up, down = _layer(4, 256, 128, seed=3)
    ids, _ = _routing(2, 2, 4, seed=9)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(DEV)
    gu = _packed([gate, up], 64, True)
    whole = gemv(gu, ids.to(DEV), x, split=1)
    parts = gemv(gu, ids.to(DEV), x, split=4)
    assert parts.shape == (4, 4, 2, 128)
    torch.testing.assert_close(parts.sum(0), whole[0], rtol=1e-5, atol=1e-5)
    # the gate rows of copy (t=1, j=0) are expert ids[1, 0]'s rows times x[1], exactly as the dequantized matmul
    from nvfp4lib.formats import dequantize

    e = int(ids[1, 0])
    want = x[1].float().cpu() @ dequantize(gate[e], torch.float32).T
    torch.testing.assert_close(whole[0, 2, 0].cpu(), want, rtol=1e-5, atol=1e-5)


def test_finalize_and_combine():
    part = torch.randn(3, 4, 2, 40, generator=torch.Generator().manual_seed(2)).to(DEV)
    g, u = part[:, :, 0].sum(0), part[:, :, 1].sum(0)
    torch.testing.assert_close(finalize(part, torch.float32).cpu(), (torch.nn.functional.silu(g) * u).cpu(),
                               rtol=1e-5, atol=1e-6)
    y = torch.randn(2, 6, 300, generator=torch.Generator().manual_seed(3)).to(DEV)
    w = torch.rand(3, 2, generator=torch.Generator().manual_seed(4)).to(DEV)
    want = (y.sum(0).view(3, 2, 300) * w.unsqueeze(-1)).sum(1)
    torch.testing.assert_close(combine(y, w, torch.float32), want, rtol=1e-5, atol=1e-5)


def test_no_tokens_and_split_choice():
    gate, up, down = _layer(2, 128, 64, seed=1)
    gu, dn = _packed([gate, up], 64, True), _packed([down], 128, False)
    out = gemv_moe(torch.zeros(0, 128, dtype=torch.bfloat16, device=DEV), torch.zeros(0, 2, dtype=torch.int64,
                   device=DEV), torch.zeros(0, 2, device=DEV), gu, dn)
    assert out.shape == (0, 128)
    assert pick_split(8, 12, 32) == 8  # 96 programs want 11 slices: the largest divisor of 32 below is 8
    assert pick_split(1000, 100, 64) == 1 and pick_split(1, 1, 3) == 1 and pick_split(1, 1, 64) == 32
    assert pick_split(8, 16, 12) == 6 and pick_split(2, 32, 224) == 16
