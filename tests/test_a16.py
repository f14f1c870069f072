"""W4A16 (bf16 activations) without a GPU: the bf16 register decode is exact for every E2M1 code × every finite E4M3
scale (its PTX's arithmetic, emulated) and lands each value in its wgmma fragment slot; every ``vl_a16_`` config
compiles for sm_90a with what it claims (bf16 wgmma, the bf16 decode, no prologue); the reference backend's bf16 call
forms, errors, custom op and tuning keys."""
import re
import types

import pytest
import torch

from nvfp4lib.formats import NVFP4Tensor, dequantize, quantize
from nvfp4lib.kernels.hopper_rs.layout import (
    A16_OWN_SHIFTS,
    A16_RS_SHIFTS,
    UNIT_BYTES,
    _byte,
    a16_units,
    a16_words,
    canonical_units,
    emulate_unit,
    prepack_units,
)
from nvfp4lib.kernels.hopper_rs.ops import (
    A16_INT_SCALE,
    A16_OPERAND_EXPONENT,
    A16_OWN_WORDS,
    A16_SCALE_BIAS,
    A16_SCALE_MASK,
    a16_decode_ptx,
    a16_shifts,
    emulate_a16_decode,
)
from nvfp4lib.kernels.hopper_varlen.config import CONFIGS, get_config
from nvfp4lib.serving import prepare_weights

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
A16 = [n for n, c in CONFIGS.items() if c.act == "bf16"]


def _value(code: torch.Tensor) -> torch.Tensor:
    return torch.where(code >= 8, -1.0, 1.0).double() * E2M1[code & 7]


# -- the decode ------------------------------------------------------------------------------------------------------
ROUTES = [pytest.param(False, id="f32-scale"), pytest.param(True, id="int-scale")]
WORDS = [pytest.param(False, id="fp16-words"), pytest.param(True, id="own-words")]


def _all_words(own=False):
    """Every code as x and as y of every byte: 256 words, in the fp16 path's layout or (``own``) W4A16's."""
    xs, ys = (t.reshape(-1) for t in torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij"))
    b = _byte(xs, ys)
    words = b | b << 8 | b << 16 | b << 24
    return xs, ys, a16_words(words) if own else words


def test_own_word_layout_moves_every_bit_once():
    """a16_words is a bit permutation (each of the 32 bits to its own place), the identity with the fp16 path's
    shifts; with W4A16's own, registers 0 and 1 take one shift each (or none) and the decode's per-word instructions
    drop from 15 integer ops to 11 (a shift per distinct non-zero shift, a mask per register, a select per register
    of two shifts)."""
    bits = torch.tensor([1 << i for i in range(32)], dtype=torch.int64)
    moved = a16_words(bits)
    assert sorted(int(v).bit_length() - 1 for v in moved) == list(range(32)) and (moved & (moved - 1) == 0).all()
    assert torch.equal(a16_words(bits, A16_RS_SHIFTS), bits)
    words = torch.randint(0, 1 << 32, (1000,), generator=torch.Generator().manual_seed(0), dtype=torch.int64)
    assert torch.equal(a16_words(words), sum(((words >> i) & 1) * moved[i] for i in range(32)))

    def ops(shifts):
        return len({s for pair in shifts for s in pair if s}) + 4 + sum(1 for s, m in shifts if s != m)
    assert a16_shifts(True) == A16_OWN_SHIFTS and a16_shifts(False) == A16_RS_SHIFTS
    assert a16_shifts() == a16_shifts(A16_OWN_WORDS)
    assert [s == m for s, m in A16_OWN_SHIFTS] == [True, True, False, False]
    assert (ops(A16_RS_SHIFTS), ops(A16_OWN_SHIFTS)) == (15, 11)


@pytest.mark.parametrize("own", WORDS)
@pytest.mark.parametrize("int_scale", ROUTES)
def test_bf16_decode_is_exact_for_every_code_and_finite_scale(int_scale, own):
    """All 16 codes as x and as y of every byte (256 words) × the finite E4M3 scales in both rows of the pair: each
    bf16 operand is exactly value × scale × 2^-14. The f32 route: all 254 (±0 and the subnormals included); the
    integer route (ops.A16_INT_SCALE): the 126 canonical non-zero ones, the subnormals included (canonical_units
    leaves no other scale beside non-zero codes). Both word layouts."""
    xs, ys, words = _all_words(own)
    sc = torch.arange(256)
    sc = sc[(sc & 0x7F) != 0x7F]  # E4M3's NaNs: S.1111.111
    if int_scale:
        sc = sc[(sc > 0) & (sc < 0x80)]
    pairs = sc | sc.flip(0) << 8
    got = emulate_a16_decode(words[:, None].expand(-1, len(sc)), pairs[None, :].expand(len(words), -1), int_scale,
                             own)
    assert got.dtype == torch.bfloat16 and got.shape == (256, len(sc), 8) and len(sc) == (126 if int_scale else 254)
    s = torch.stack([sc, sc.flip(0)], -1).to(torch.uint8).view(torch.float8_e4m3fn).double()  # (row g, row g+8)
    vx, vy = _value(xs)[:, None], _value(ys)[:, None]
    lo, hi = s[None, :, 0], s[None, :, 1]
    # fragment order: reg0 (x, row g), reg1 (x, row g+8), reg2 (y, row g), reg3 (y, row g+8), each lo/hi half
    want = torch.stack([vx * lo, vx * lo, vx * hi, vx * hi, vy * lo, vy * lo, vy * hi, vy * hi], -1)
    want = want * 2.0**A16_OPERAND_EXPONENT
    assert torch.equal(got.double(), want)
    assert torch.equal(got.double().signbit(), want.signbit())  # -0 where the value or the scale is negative


@pytest.mark.parametrize("own", WORDS)
@pytest.mark.parametrize("int_scale", ROUTES)
def test_bf16_decode_of_a_nan_scale_is_nan_in_its_row_only(int_scale, own):
    """A NaN scale (either sign) decodes its row's operands to NaN and leaves the other row of the pair exact: the
    integer route's mask keeps a NaN's low bits from spilling into the other half. A zero scale beside zero codes
    (canonical) decodes to zeros on both routes. Both word layouts."""
    xs, ys, words = _all_words(own)
    ones = torch.tensor([0x38, 0x41, 0x01])  # 1.0, 2.25, the smallest subnormal
    for nan in (0x7F, 0xFF):
        for other in ones:
            for pair, row in ((nan | int(other) << 8, 0), (int(other) | nan << 8, 1)):
                got = emulate_a16_decode(words, torch.full_like(words, pair), int_scale, own).double()
                nan_slots = [q * 2 + h for q in range(4) for h in (0, 1) if q % 2 == row]
                ok_slots = [i for i in range(8) if i not in nan_slots]
                assert got[:, nan_slots].isnan().all()
                s = float(torch.tensor([int(other)], dtype=torch.uint8).view(torch.float8_e4m3fn).double())
                v = torch.stack([_value(xs), _value(xs), _value(ys), _value(ys)], -1)[:, [q // 2 for q in ok_slots]]
                assert torch.equal(got[:, ok_slots], v * s * 2.0**A16_OPERAND_EXPONENT)
    zero = emulate_a16_decode(torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64), int_scale, own)
    assert torch.equal(zero.double(), torch.zeros(4, 8, dtype=torch.float64))


def _emulate_unit_a16(unit: torch.Tensor, int_scale: bool | None = None, own: bool = False) -> torch.Tensor:
    """One prepacked 64×64 unit decoded as the 128 threads of a warpgroup would: [64, 64] float64 × 2^14."""
    u = unit.to(torch.int64)
    t = torch.arange(128)
    w, g, c = t // 32, (t % 32) // 4, t % 4
    e = 2048 + 8 * (8 * w + g)
    out = torch.empty((64, 64), dtype=torch.float64)
    for j in range(4):
        word = sum(u[16 * t + 4 * j + b] << (8 * b) for b in range(4))
        pair = u[e + 2 * j] | u[e + 2 * j + 1] << 8
        vals = emulate_a16_decode(word, pair, int_scale, own).double()  # [128, 8]
        r, k = 16 * w + g, 16 * j + 2 * c
        for q in range(4):
            rr, kk = r + 8 * (q % 2), k + 8 * (q // 2)
            out[rr, kk], out[rr, kk + 1] = vals[:, 2 * q], vals[:, 2 * q + 1]
    return out * 2.0**-A16_OPERAND_EXPONENT


@pytest.mark.parametrize("seed", [0, 1])
def test_prepacked_unit_decodes_to_the_dequantized_tile_in_bf16(seed, monkeypatch):
    """The same prepacked bytes as the fp16 path: each thread's bf16 registers are its wgmma A fragment. Made
    canonical (``canonical_units``: negative and zero scales among the random ones, a third of them), the units
    decode to the same tile on both routes and on the fp16 path; the integer route needs it (not canonical, it
    differs), and canonical units stay as they are. ``a16_units`` with W4A16's own words: the same tile through the
    own layout's decode (and only through it), the scale bytes as canonical_units leaves them."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (128, 64), generator=gen, dtype=torch.uint8)
    finite = torch.arange(256)[(torch.arange(256) & 0x7F) != 0x7F].to(torch.uint8)
    scales = finite[torch.randint(0, len(finite), (128, 8), generator=gen)]
    scales[torch.randint(0, 3, scales.shape, generator=gen) == 0] = 0x80  # -0 (0x00 is among the finite ones)
    ref = dequantize(NVFP4Tensor(codes, scales.view(torch.float8_e4m3fn), 1.0)).double()
    units = prepack_units(codes, scales)
    assert units.shape == (2, 2, UNIT_BYTES)
    from nvfp4lib.kernels.hopper_rs import layout

    monkeypatch.setattr(layout, "CANONICAL_UNITS", 3)  # (4 units: two steps, the last one short)
    canon = canonical_units(units.clone())
    assert torch.equal(canonical_units(canon.clone()), canon)
    assert not (canon[..., 2048:] & 0x80).any()
    monkeypatch.setattr(layout, "A16_RELAYOUT_UNITS", 3)
    own = a16_units(units.clone(), True)
    assert torch.equal(a16_units(units.clone(), False), canon) and torch.equal(own[..., 2048:], canon[..., 2048:])
    for rb in range(2):
        for kc in range(2):
            tile = ref[64 * rb: 64 * rb + 64, 64 * kc: 64 * kc + 64]
            assert torch.equal(_emulate_unit_a16(units[rb, kc], False), tile)
            for int_scale in (False, True):
                assert torch.equal(_emulate_unit_a16(canon[rb, kc], int_scale), tile)
            assert torch.equal(emulate_unit(canon[rb, kc]).double(), tile)
            for int_scale in (False, True):
                assert torch.equal(_emulate_unit_a16(own[rb, kc], int_scale, own=True), tile)
            assert not torch.equal(_emulate_unit_a16(own[rb, kc], True, own=False), tile)
    tiles = [(rb, kc, ref[64 * rb: 64 * rb + 64, 64 * kc: 64 * kc + 64]) for rb in range(2) for kc in range(2)]
    assert not all(torch.equal(_emulate_unit_a16(units[rb, kc], True), tile) for rb, kc, tile in tiles)


@pytest.mark.parametrize("own", WORDS)
@pytest.mark.parametrize("int_scale", ROUTES)
def test_decode_ptx_is_the_emulated_arithmetic(int_scale, own):
    """The PTX the kernel inlines does, per k16 word, what emulate_a16_decode computes: the pair's scales (e4m3x2 ->
    f16x2, then each -> f32 × 2^112 -> bf16x2; or the integer route: a mask and one mad.hi by 2^29 adding the
    exponent bias), the layout's shifts (a16_shifts), a lop3 select per register of two shifts, a mask per register,
    one bf16x2 multiply per register; per thread and unit: 4 words. Without arguments it builds the knobs'."""
    ptx = a16_decode_ptx(int_scale, own)
    assert a16_decode_ptx() == a16_decode_ptx(A16_INT_SCALE, A16_OWN_WORDS)
    count = {i: len(re.findall(re.escape(i), ptx)) for i in (
        "cvt.rn.f16x2.e4m3x2", "cvt.f32.f16", "mul.rn.f32", "cvt.rn.bf16x2.f32", "mad.hi.u32", "lop3.b32", "and.b32",
        "mul.rn.bf16x2", "mul.rn.f16x2")}
    route = ({"cvt.f32.f16": 0, "mul.rn.f32": 0, "cvt.rn.bf16x2.f32": 0, "mad.hi.u32": 4, "and.b32": 20} if int_scale
             else {"cvt.f32.f16": 8, "mul.rn.f32": 8, "cvt.rn.bf16x2.f32": 8, "mad.hi.u32": 0, "and.b32": 16})
    assert count == {"cvt.rn.f16x2.e4m3x2": 4, "lop3.b32": 8 if own else 16, "mul.rn.bf16x2": 16, "mul.rn.f16x2": 0,
                     **route}
    if int_scale:
        assert f"and.b32 f, f, {A16_SCALE_MASK:#010x};" in ptx
        assert f"mad.hi.u32 f, f, 0x20000000, {A16_SCALE_BIAS:#010x};" in ptx
    else:
        assert "0f77800000" in ptx  # 2^112
    for sign, mag in a16_shifts(own):
        if sign != mag and sign:
            assert f"shl.b32 a, $16, {sign};" in ptx
        if mag:
            assert (f"shl.b32 b, $16, {mag};" if mag > 0 else f"shr.u32 b, $16, {-mag};") in ptx
        elif sign == mag:
            assert "and.b32 t, $16, mf;" in ptx


# -- the kernel, compiled for sm_90a ---------------------------------------------------------------------------------
def test_a16_configs_mirror_the_fastest_nvfp4_ones():
    from nvfp4lib.tuning import DECODE_PAIR_TIER, DECODE_S5_TIER, DECODE_T32_TIER, NARROW_PAIR_TIER, PREFERENCE

    tiers = PREFERENCE + (DECODE_S5_TIER, DECODE_T32_TIER, DECODE_PAIR_TIER, NARROW_PAIR_TIER)
    preferred = {n for _, names in tiers for n in names}
    preferred |= {"vl_m256_t16_k128_s4_e_b2", "vl_dual_m128_t16_k128_s4_e_b2"}  # (tuning candidates, no tier's)
    assert len(A16) == 22
    for name in A16:
        nv = name.replace("vl_a16_", "vl_", 1)
        assert nv in preferred and CONFIGS[name] == CONFIGS[nv].with_(name=name, act="bf16")
    with pytest.raises(ValueError, match="bf16 activations"):
        get_config(A16[0], False, "nvfp4")
    with pytest.raises(ValueError, match="act="):
        get_config(CONFIGS[A16[0]].with_(act="fp8"), False)


@pytest.mark.slow
@pytest.mark.parametrize("name", A16)
def test_every_a16_config_compiles_for_sm90a(name, monkeypatch):
    """K = 1000 (not a multiple of the 128-K tile: TMA zero-fills past K). The PTX holds one kernel, no prologue;
    every wgmma is bf16 × bf16 -> f32 with A from registers; the bf16 decode once per (variant, sub-block, block)."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    cfg = CONFIGS[name]
    r = compile_report(cfg, groups=8, n=4096, k_pad=1024, k=1000, ptxas=False)
    ptx = r["ptx"]
    variants, nsub = cfg.tile_n // cfg.step, cfg.tile_k // 64
    wgmma = re.findall(r"wgmma\.mma_async\S*", ptx)
    assert len(wgmma) == r["gemm"]["wgmma.mma_async"] == variants * (cfg.tile_k // 16) * cfg.blocks
    assert {w.split(".")[-3:] == ["f32", "bf16", "bf16"] for w in wgmma} == {True}
    assert r["prologue"] is None and ptx.count(".entry") == 1
    decodes = variants * nsub * cfg.blocks
    assert ptx.count("mul.rn.bf16x2") == 16 * decodes and ptx.count("cvt.rn.f16x2.e4m3x2") == 4 * decodes
    assert "mul.rn.f16x2" not in ptx  # nothing decodes to fp16
    assert r["gemm"]["cp.async.bulk.tensor"] > 0 and "griddepcontrol.wait" in ptx


# -- the reference backend -------------------------------------------------------------------------------------------
def _weights(g=3, n=64, k=128, seed=0):
    torch.manual_seed(seed)
    return [quantize(torch.randn(n, k)) for _ in range(g)]


def _want(x, b, b2=None):
    """fp32 products on the dequantized weights (one rounding, to fp16)."""
    y = x.float() @ dequantize(b).T
    if b2 is not None:
        y = torch.nn.functional.silu(y) * (x.float() @ dequantize(b2).T)
    return y.to(torch.float16)


@pytest.mark.parametrize("dual", [False, True])
def test_reference_bf16_list_and_packed_forms(dual):
    b, b2 = _weights(), (_weights(seed=1) if dual else None)
    xs = [(torch.randn(m, 128) * 3).to(torch.bfloat16) for m in (5, 0, 7)]
    w = prepare_weights(b, b2, backend="reference", activations="bf16")
    outs = w(xs)
    for g, (o, x) in enumerate(zip(outs, xs)):
        assert o.shape == (x.shape[0], 64) and o.dtype == torch.float16
        assert torch.equal(o, _want(x, b[g], None if b2 is None else b2[g]))
    c = w(torch.cat(xs), torch.tensor([0, 5, 5, 12], dtype=torch.int32))
    assert torch.equal(c[:5], outs[0]) and torch.equal(c[5:], outs[2])
    one = w(xs[0][:1], torch.tensor([0, 0, 1, 1], dtype=torch.int32))  # T = 1, in group 1
    assert torch.equal(one, _want(xs[0][:1], b[1], None if b2 is None else b2[1]))
    out = torch.empty(12, 64, dtype=torch.float16)
    assert w(torch.cat(xs), torch.tensor([0, 5, 5, 12], dtype=torch.int32), out=out) is out and torch.equal(out, c)


def test_reference_bf16_refuses_with_the_rule():
    w = prepare_weights(_weights(), backend="reference", activations="bf16")
    x = torch.randn(12, 128).to(torch.bfloat16)
    off = torch.tensor([0, 4, 4, 12], dtype=torch.int32)
    with pytest.raises(TypeError, match="bfloat16"):
        w(x.half(), off)
    with pytest.raises(TypeError, match="activations='nvfp4'"):
        w(quantize(torch.randn(12, 128)), off)
    with pytest.raises(ValueError, match="K=256"):
        w(torch.randn(12, 256).to(torch.bfloat16), off)
    with pytest.raises(ValueError, match=r"shape \(12,\)"):
        w(x[:, 0], off)
    with pytest.raises(TypeError, match="global_scale"):
        w(x, off, global_scale=torch.ones(1))
    with pytest.raises(TypeError, match="int32"):
        w(x, off.long())
    with pytest.raises(ValueError, match=r"\[G\+1\]"):
        w(x, off[:-1])
    with pytest.raises(ValueError, match="3 bf16 tensors"):
        w([x])
    with pytest.raises(ValueError, match="offsets"):
        w(x)
    with pytest.raises(TypeError, match=r"a\[1\] must be a bf16"):
        w([x, x.float(), x])
    with pytest.raises(ValueError, match="activations must be"):
        prepare_weights(_weights(), backend="reference", activations="fp8")
    nv = prepare_weights(_weights(), backend="reference")
    with pytest.raises(TypeError, match="NVFP4Tensor"):
        nv(x, off)


def test_a16_custom_op_compiles_and_passes_opcheck():
    w = prepare_weights(_weights(), _weights(seed=1), backend="reference", activations="bf16")
    x = torch.randn(12, 128).to(torch.bfloat16)
    off = torch.tensor([0, 4, 4, 12], dtype=torch.int32)
    eager = w(x, off)
    compiled = torch.compile(lambda x, o: w(x, o), fullgraph=True)
    assert torch.equal(compiled(x, off), eager)
    torch.library.opcheck(torch.ops.nvfp4lib.grouped_mm_a16, (x, off, w.handle))


def test_tuning_key_and_heuristic_know_the_activation_type():
    """The bf16 configs rank as their NVFP4 twins until timed; their cache entries never mix with NVFP4's."""
    from nvfp4lib.serving import _CuteHopperImpl

    single = [n for n in A16 if not CONFIGS[n].dual]
    fake = types.SimpleNamespace(activations="bf16", candidates=single, k=2048,
                                 weights=types.SimpleNamespace(dual=False))
    assert _CuteHopperImpl._heuristic(fake, 128) == "vl_a16_m128_t256_k128_s3_v32_e"
    assert _CuteHopperImpl._heuristic(fake, 2) == "vl_a16_m128_t16_k128_s8_e_x"
    assert _CuteHopperImpl._heuristic(fake, 1024) == "vl_a16_m128_t128_k128_s4_e"
    dual64 = [n for n in A16 if CONFIGS[n].dual and CONFIGS[n].tile_m == 64]
    fake = types.SimpleNamespace(activations="bf16", candidates=dual64, k=2048,
                                 weights=types.SimpleNamespace(dual=True))
    assert _CuteHopperImpl._heuristic(fake, 64) == "vl_a16_dual_m64_t256_k128_s3_v32_e"
    assert _CuteHopperImpl._heuristic(fake, 512) == "vl_a16_dual_m64_t96_k128_s3_e"
    from nvfp4lib.serving import tuning_layout
    from nvfp4lib.tuning import problem_key

    keys = {problem_key("H100", "cute-hopper", False, torch.float16, 8, 4096, 7168, 128, tuning_layout(128, 128, act))
            for act in ("nvfp4", "bf16")}
    assert len(keys) == 2 and tuning_layout(128, 128) == "m128k128"  # the NVFP4 keys already cached stay valid
