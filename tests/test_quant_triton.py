"""The Triton form of the layer's activation quantizer gives the torch form's bits: codes, E4M3 scale bytes and the
global scale, on wide-ranged, tied, zero and signed-zero inputs (Triton's interpreter on the CPU; skipped where
Triton is missing)."""
import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1", allow_module_level=True)

from nvfp4lib.nn.quant import quantize_rows  # noqa: E402
from nvfp4lib.nn.quant_triton import quantize_rows_triton  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True, params=[False, True], ids=["grid", "one-program"])
def one_program(request, monkeypatch):
    """Every test twice: as shipped (the grid launches), and with quant_triton.ONE_PROGRAM on, where inputs of at
    most ONE_PROGRAM_ELEMENTS quantize in one program (the same bits)."""
    from nvfp4lib.nn import quant_triton

    monkeypatch.setattr(quant_triton, "ONE_PROGRAM", request.param)
    return request.param


@pytest.fixture(autouse=True, params=[True, False], ids=["small-tiles", "default-tiles"])
def small_tiles(request, monkeypatch):
    """Every test with quant_triton.SMALL_TILES on and as shipped (off): the same bits either way."""
    from nvfp4lib.nn import quant_triton

    monkeypatch.setattr(quant_triton, "SMALL_TILES", request.param)
    return request.param


def test_small_inputs_take_smaller_tiles(small_tiles):
    """SMALL_TILES: the Qwen3-like inputs at T = 1 (8 rows x 128 blocks, and the intermediate's 8 x 48) get at least
    SMALL_PROGRAMS programs (2 x 4 and 1 x 4 blocks per program) instead of 8 and 4; a large input keeps the default
    tile and 4 warps; off, every input keeps it."""
    from nvfp4lib.nn import quant_triton as q

    default = ({"R": q.ROWS_PER_PROGRAM, "CB": q.BLOCKS_PER_PROGRAM}, 4)
    assert q._tiling(4096, 448) == default
    for rows, nblk, tile, warps in ((8, 128, {"R": 2, "CB": 4}, 2), (8, 48, {"R": 1, "CB": 4}, 1)):
        got = q._tiling(rows, nblk)
        if not small_tiles:
            assert got == default
            continue
        assert got == (tile, warps)
        g = q._grid(rows, nblk, got[0])
        assert g[0] * g[1] >= min(q.SMALL_PROGRAMS, rows * nblk // 4) and g[0] * tile["R"] >= rows
        assert g[1] * tile["CB"] >= nblk


def test_the_one_program_form_is_taken_where_it_fits(one_program, monkeypatch):
    from nvfp4lib.nn import quant_triton

    launched = []
    real = quant_triton.launch
    monkeypatch.setattr(quant_triton, "launch", lambda kernel, *a, **k: (launched.append(kernel), real(kernel, *a,
                                                                                                          **k))[1])
    x = torch.randn(8, 768)  # the Qwen3-like intermediate at T = 1: 8 rows x 48 blocks -> a tile of 8 x 64 blocks
    _same(x)
    want = [quant_triton._quant_one_kernel] if one_program else [quant_triton._amax_kernel, quant_triton._quant_kernel]
    assert launched == want
    launched.clear()
    _same(torch.randn(16, 2048))  # 16 x 128 blocks: past ONE_PROGRAM_ELEMENTS, the grid form either way
    assert launched == [quant_triton._amax_kernel, quant_triton._quant_kernel]
    launched.clear()
    x = torch.randn(1, 2048)  # the Qwen3-like layer input at T = 1, its 8 copies gathered: one program too
    index = torch.zeros(8, dtype=torch.int64)
    got = quant_triton.quantize_rows_triton(x.to(DEV), None, index.to(DEV))
    codes, scales, g = quantize_rows(x)
    assert torch.equal(got[0].cpu(), codes[index]) and torch.equal(got[2].cpu(), g)
    assert torch.equal(got[1].view(torch.uint8).cpu(), scales.view(torch.uint8)[index])
    assert launched == ([quant_triton._quant_one_kernel] if one_program
                        else [quant_triton._amax_kernel, quant_triton._quant_kernel])


def _same(x, g=None):
    want = quantize_rows(x.cpu(), None if g is None else g.cpu())
    got = quantize_rows_triton(x.to(DEV), None if g is None else g.to(DEV))
    assert torch.equal(got[0].cpu(), want[0]), "codes"
    assert torch.equal(got[1].cpu().view(torch.uint8), want[1].view(torch.uint8)), "scales"
    assert torch.equal(got[2].cpu(), want[2]), "global scale"
    return got


@pytest.mark.parametrize("shape,dtype", [((37, 64), torch.bfloat16), ((5, 2880), torch.float32),
                                         ((2, 3, 32), torch.float16), ((1, 16), torch.bfloat16)])
def test_random_wide_range(shape, dtype):
    gen = torch.Generator().manual_seed(7)
    span = 3 if dtype == torch.float16 else 6  # finite in the input's dtype (non-finite input is unspecified)
    x = torch.randn(shape, generator=gen) * torch.pow(10.0, torch.empty(shape).uniform_(-span, span, generator=gen))
    _same(x.to(dtype))
    _same(x.to(dtype), torch.tensor([0.003]))


def test_ties_of_the_scale_and_of_the_codes():
    # global scale 1: a block's max m gives the scale m / 6 -> E4M3 ties (normal and subnormal) and E2M1 ties
    ties = [1.0625, 1.1875, 3.25, 0.0029296875 * 0.5, 0.001953125 * 1.5, 0.001953125 * 2.5, 0.001953125 * 0.5,
            447.9, 460.0, 0.015625 - 0.0009765625]
    rows = []
    for s in ties:
        row = torch.tensor([6 * s] + [6 * s * f for f in (0.25, 0.75, 1.25 / 6, 1.75 / 6, 2.5 / 6, 3.5 / 6, 5 / 6,
                                                          -0.25 / 6, -0.0, 0.0, 1 / 12, -1 / 12, 0.5, 0.1, 0.9)])
        rows.append(row)
    x = torch.stack(rows)
    _same(x, torch.tensor([1.0]))
    _same(x)


def test_zeros_signed_zeros_and_empty():
    _same(torch.zeros(3, 32))  # amax 0: global scale 1, every code +0
    z = torch.zeros(2, 16)
    z[0, ::2] = -0.0
    z[1, 3] = 1.0
    _same(z)
    got = _same(torch.zeros(0, 64))
    assert got[0].shape == (0, 32) and got[1].shape == (0, 4)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_rows_triton(torch.zeros(2, 24, device=DEV))
    with pytest.raises(ValueError, match="contiguous"):
        quantize_rows_triton(torch.zeros(32, 4, device=DEV).t())


def test_the_layer_gives_the_same_output_with_either_quantizer():
    from nvfp4lib.nn import NVFP4MoE

    g = torch.Generator().manual_seed(3)
    w = [torch.randn(4, *s, generator=g).mul(0.1).to(torch.bfloat16) for s in ((32, 64), (32, 64), (64, 32))]
    x = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [1, 2], [3, 0], [2, 3], [1, 0]])
    tw = torch.softmax(torch.randn(5, 2, generator=g), -1)
    outs = []
    for q in ("torch", "triton"):
        layer = NVFP4MoE.from_float(*[t.to(DEV) for t in w], backend="reference", quantizer=q)
        outs.append(layer(x.to(DEV), ids.to(DEV), tw.to(DEV)))
        assert f"quantizer='{q}'" in repr(layer)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("static", [False, True])
def test_index_fuses_the_gather(static):
    """index: the rows x[index] quantized with x's global scale, bit for bit the torch form then the gather."""
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)) * 4
    index = torch.tensor([4, 0, 0, 2, 3, 1, 4, 4])
    gs = torch.tensor([0.0123]) if static else None
    codes, scales, g = quantize_rows(x, gs)
    got = quantize_rows_triton(x.to(DEV), None if gs is None else gs.to(DEV), index.to(DEV))
    assert torch.equal(got[0].cpu(), codes[index])
    assert torch.equal(got[1].view(torch.uint8).cpu(), scales.view(torch.uint8)[index])
    assert torch.equal(got[2].cpu(), g)
    empty = quantize_rows_triton(x.to(DEV), None if gs is None else gs.to(DEV), index[:0].to(DEV))
    assert empty[0].shape == (0, 32) and empty[1].shape == (0, 4) and torch.equal(empty[2].cpu(), g)


def test_amax_reduce_replaces_the_amax_before_the_scale():
    """quantize_rows_triton's amax_reduce (expert parallelism's group max): called once with x's amax(|x|), in place;
    the outputs are those of the reduced amax's global scale."""
    from nvfp4lib.nn.quant import global_scale_of

    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(4))
    seen = []

    def reduce(amax):
        seen.append(float(amax.cpu()))
        amax.mul_(3.0)

    got = quantize_rows_triton(x.to(DEV), None, None, reduce)
    assert seen == [float(x.abs().amax())]
    want = quantize_rows(x, global_scale_of(x.abs().amax() * 3.0))
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[2].cpu(), want[2])
    assert torch.equal(got[1].cpu().view(torch.uint8), want[1].view(torch.uint8))


def test_valid_rows_only_count_and_are_quantized():
    """quantize_rows_triton's valid (an expert GEMM's output, rows past the offsets unspecified): the first valid[0]
    rows give the outputs of quantizing them alone, whatever the other rows hold (here huge and NaN)."""
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(6))
    x[5:] = float("nan")
    x[4] = 1e30
    want = quantize_rows(x[:4])
    got = quantize_rows_triton(x.to(DEV), None, None, None, torch.tensor([4], dtype=torch.int32, device=DEV))
    assert torch.equal(got[0][:4].cpu(), want[0]) and torch.equal(got[2].cpu(), want[2])
    assert torch.equal(got[1][:4].cpu().view(torch.uint8), want[1].view(torch.uint8))
    with pytest.raises(ValueError, match="valid needs"):
        quantize_rows_triton(x.to(DEV), None, torch.zeros(2, dtype=torch.int64, device=DEV), None,
                             torch.tensor([4], dtype=torch.int32, device=DEV))


def test_strided_rows_and_negative_indices():
    """A 2-D x with a row stride (the EP all-gather's received rows, read in place) quantizes as its contiguous copy;
    a negative index leaves its output row unspecified and reads nothing."""
    x = torch.randn(6, 80, generator=torch.Generator().manual_seed(7))
    view = x[:, 8:72]  # 64 columns, rows 80 apart
    index = torch.tensor([5, -1, 0, 2, -1])
    got = quantize_rows_triton(view.to(DEV), None, index.to(DEV))
    codes, scales, g = quantize_rows(view.contiguous())
    keep = index >= 0
    assert torch.equal(got[2].cpu(), g)
    assert torch.equal(got[0].cpu()[keep], codes[index[keep]])
    assert torch.equal(got[1].cpu().view(torch.uint8)[keep], scales.view(torch.uint8)[index[keep]])


def _operand_of(codes, scales, k_pad):
    """The serving GEMM's fp16 operand that its activation prologue decodes from codes and scale bytes: each element
    e2m1 · block scale · 2^-7, columns past K zeros (torch, exact)."""
    from nvfp4lib.formats import e2m1_decode, unpack_e2m1

    v = e2m1_decode(unpack_e2m1(codes)) * scales.float().repeat_interleave(16, dim=-1) * 2.0 ** -7
    return torch.nn.functional.pad(v, (0, k_pad - v.shape[-1])).to(torch.float16)


@pytest.mark.parametrize("static,k_pad,index", [(False, 64, None), (True, 128, None), (False, 256, [4, 0, 0, 2, 3]),
                                                (True, 64, [1, -1, 3])])
def test_the_operand_is_what_the_prologue_decodes(static, k_pad, index):
    """quantize_to_operand: the fp16 operand [R, k_pad] holds, bit for bit (signed zeros too), what the GEMM's
    prologue decodes from quantize_rows' codes and scales (ties, wide range, signed zeros, a zero block); the
    padding columns are zeros; the global scale is the same; a negative index's row is unspecified."""
    from nvfp4lib.nn.quant_triton import quantize_to_operand

    gen = torch.Generator().manual_seed(11)
    x = torch.randn(5, 64, generator=gen) * torch.pow(10.0, torch.empty(5, 64).uniform_(-5, 5, generator=gen))
    x[0, :16] = torch.tensor([6 * 1.0625 * f for f in (1, 0.25, 0.75, -0.125, 1.75 / 6, 2.5 / 6, 3.5 / 6, 5 / 6,
                                                       -0.25 / 6, -0.0, 0.0, 1 / 12, -1 / 12, 0.5, 0.1, 0.9)])
    x[1, 16:32] = 0.0
    x[2, 32:48:2] = -0.0
    gs = torch.tensor([0.0123]) if static else None
    codes, scales, g = quantize_rows(x, gs)
    want = _operand_of(codes, scales.view(torch.uint8).view(torch.float8_e4m3fn), k_pad)
    idx = None if index is None else torch.tensor(index)
    x16, g2 = quantize_to_operand(x.to(DEV), k_pad, None if gs is None else gs.to(DEV),
                                  None if idx is None else idx.to(DEV))
    assert x16.dtype == torch.float16 and tuple(x16.shape) == (5 if idx is None else len(index), k_pad)
    assert torch.equal(g2.cpu(), g)
    rows = torch.arange(5) if idx is None else idx
    keep = rows >= 0
    assert torch.equal(x16.cpu()[keep].view(torch.int16), want[rows[keep]].view(torch.int16))


def test_the_operand_refuses_bad_shapes():
    from nvfp4lib.nn.quant_triton import quantize_to_operand

    with pytest.raises(ValueError, match="k_pad=48"):
        quantize_to_operand(torch.zeros(2, 64, device=DEV), 48)
    with pytest.raises(ValueError, match="2-D"):
        quantize_to_operand(torch.zeros(2, 2, 64, device=DEV), 64)


@pytest.mark.parametrize("static", [False, True])
def test_the_layer_quantizing_into_the_operand_gives_the_same_output(static, monkeypatch):
    """nn.moe.QUANT_TO_OPERAND (the Triton quantizer writing the GEMMs' operands, PreparedWeights.call_operand) gives
    the output of codes and scales (the reference backend, whose operand form decodes the operand back)."""
    from nvfp4lib.nn import NVFP4MoE, moe

    g = torch.Generator().manual_seed(4)
    w = [torch.randn(4, *s, generator=g).mul(0.1).to(torch.bfloat16) for s in ((32, 64), (32, 64), (64, 32))]
    x = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [1, 2], [3, 0], [2, 3], [1, 0]])
    tw = torch.softmax(torch.randn(5, 2, generator=g), -1)
    layer = NVFP4MoE.from_float(*[t.to(DEV) for t in w], backend="reference", quantizer="triton",
                                input_scales=(0.01, 0.002) if static else None)
    outs = []
    for on in (False, True):
        monkeypatch.setattr(moe, "QUANT_TO_OPERAND", on)
        outs.append(layer(x.to(DEV), ids.to(DEV), tw.to(DEV)))
    assert torch.equal(outs[0], outs[1])
