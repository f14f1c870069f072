"""The swap-AB kernel without a GPU: the weight prepack and the register decode reproduce NVFP4 exactly (bit for
bit, as the PTX computes it), the token tiles cover every group, the tile table computes every group's product,
and impossible configs are refused before compiling."""
import pytest
import torch

from nvfp4lib.bench.backends import AUTO_CANDIDATES
from nvfp4lib.formats import E2M1_VALUES, NVFP4Tensor, dequantize
from nvfp4lib.kernels.common.packing import WIDE_TILE_COLUMNS, padded_row_offsets, stack_weights
from nvfp4lib.kernels.hopper_rs import runner as hopper_rs
from nvfp4lib.kernels.hopper_rs.config import RS_CONFIGS, RSConfig
from nvfp4lib.kernels.hopper_rs.layout import (
    RAW_EXPONENT,
    UNIT_BYTES,
    _byte,
    emulate_rs_decode,
    emulate_unit,
    prepack_units,
    prepack_weights,
)
from nvfp4lib.kernels.hopper_smem import kernel as hopper
from nvfp4lib.kernels.hopper_smem.kernel import CONFIGS, get_config

RS = RSConfig("t", tile_m=128, tile_n=128, tile_k=128, ab_stages=4)


def _rand(rows, k, gen, scale_bytes=None):
    codes = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=gen)
    if scale_bytes is None:
        scales = torch.randint(0, 0x7F, (rows, k // 16), dtype=torch.uint8, generator=gen)  # finite, subnormals too
    else:
        scales = scale_bytes[torch.randint(0, len(scale_bytes), (rows, k // 16), generator=gen)]
    return codes, scales


@pytest.mark.parametrize("raw", [False, True])
def test_register_decode_is_exact_for_every_code_and_scale(raw):
    """Every E2M1 code in each of a word's 8 slots × every finite E4M3 scale pair, as RS_DECODE_PTX computes it (and
    its raw form, the scale not × 2^7: products down to fp16 subnormals, kept exact)."""
    scale = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    for c in range(16):
        b = int(_byte(torch.tensor(c), torch.tensor(c)))
        word = b | b << 8 | b << 16 | b << 24
        for lo in range(0, 256, 3):
            hi = (lo * 7 + 5) % 256
            if lo & 0x7F == 0x7F or hi & 0x7F == 0x7F:
                continue
            got = emulate_rs_decode(word, lo | hi << 8, raw)
            v = (-1.0 if c & 8 else 1.0) * E2M1_VALUES[c & 7] * 2.0 ** (RAW_EXPONENT if raw else -7)
            # registers 0, 2 belong to row g (low scale byte), 1, 3 to row g+8 (high)
            want = [v * float(scale[lo if q % 2 == 0 else hi]) for q in range(4) for _ in range(2)]
            assert got == want, (c, lo, hi)


@pytest.mark.parametrize("seed,raw", [(0, False), (1, False), (0, True)])
def test_prepacked_unit_decodes_to_the_dequantized_tile(seed, raw):
    gen = torch.Generator().manual_seed(seed)
    codes, scales = _rand(128, 128, gen)
    ref = dequantize(NVFP4Tensor(codes, scales.view(torch.float8_e4m3fn), 1.0))
    units = prepack_units(codes, scales)
    assert units.shape == (2, 2, UNIT_BYTES)
    for rb in range(2):
        for kc in range(2):
            assert torch.equal(emulate_unit(units[rb, kc], raw), ref[64 * rb: 64 * rb + 64, 64 * kc: 64 * kc + 64])


@pytest.mark.parametrize("blocks", [1, 2])
def test_cta_blocks_hold_the_units_each_warpgroup_reads(blocks):
    gen = torch.Generator().manual_seed(3)
    c0, s0 = _rand(256, 128, gen)
    c1, s1 = _rand(256, 128, gen)
    u0, u1 = prepack_units(c0, s0), prepack_units(c1, s1)
    single = prepack_weights([(c0, s0)], 2, blocks)
    per = 2 * blocks
    assert single.shape == (4 // per, 2, per, UNIT_BYTES)
    for cta in range(4 // per):
        for w in range(2):
            for b in range(blocks):  # warpgroup w, block b: rows (cta*per + w*blocks + b)*64
                assert torch.equal(single[cta, :, w * blocks + b], u0[cta * per + w * blocks + b])
    dual = prepack_weights([(c0, s0), (c1, s1)], 2, blocks)
    for cta in range(4 // blocks):
        for b in range(blocks):  # warpgroup 0: the gate's rows, warpgroup 1: the same rows of up
            assert torch.equal(dual[cta, :, b], u0[cta * blocks + b])
            assert torch.equal(dual[cta, :, blocks + b], u1[cta * blocks + b])
    with pytest.raises(ValueError, match="rows % 64"):
        prepack_units(c0[:100], s0[:100])


def test_token_tiles_cover_every_group():
    for m, step, tile_n in [((80, 176, 128, 72, 64, 248, 96, 160), 32, 256), ((0, 1, 7, 65, 129, 200), 8, 64),
                            ((1024,) * 3, 32, 256), ((40, 76, 168), 16, 128)]:
        plan = hopper_rs.plan_token_tiles(m, [8] * len(m), [16] * len(m), tile_n, step, 132)
        for mg, tiles in zip(m, plan):
            assert sum(w for _, w in tiles) == mg
            assert [m0 for m0, _ in tiles] == [sum(w for _, w in tiles[:i]) for i in range(len(tiles))]
            assert all(w <= tile_n and m0 % step == 0 for m0, w in tiles)
    assert hopper_rs.split_tokens(196, 3, 16) == [(0, 80), (80, 80), (160, 36)]
    assert hopper_rs.makespan([4, 3, 3, 2, 2, 2], 3) == 6


def test_small_problems_get_more_ctas():
    """Two groups, 24 weight blocks: the fewest tiles leave most of 132 SMs idle; the plan splits them."""
    plan = hopper_rs.plan_token_tiles((192, 320), [32, 32], [24, 24], 256, 32, 132)
    assert sum(len(t) for t in plan) * 24 > 3 * 24


def test_the_configs_cta_overhead_steers_the_token_tiles():
    """cta_overhead_tokens is the planner's price of a CTA: past one CTA per SM, costly CTAs are not split further."""
    m, kt, nb = (40, 76, 168, 300), [32] * 4, [24] * 4
    assert [len(t) for t in hopper_rs.plan_token_tiles(m, kt, nb, 256, 32, 132)] == [1, 1, 3, 5]
    assert [len(t) for t in hopper_rs.plan_token_tiles(m, kt, nb, 256, 32, 132, overhead=10**6)] == [1, 1, 1, 2]
    n, k, offs = (3072,) * 4, (4096,) * 4, (0, 64, 160, 352)
    cfg = RS.with_(tile_n=256, token_step=32, ab_stages=3)
    rows = [len(hopper_rs.swap_tile_table(m, n, k, offs, 3072, c, 132, "cpu"))
            for c in (cfg, cfg.with_(cta_overhead_tokens=10**6))]
    assert rows == [24 * 10, 24 * 5]


@pytest.mark.parametrize("cfg", [RS, RS.with_(tile_n=96, token_step=32), RS.with_(tile_m=64, dual=True),
                                 RS.with_(tile_m=256, tile_n=64, ab_stages=6)], ids=["fixed", "variants", "dual",
                                                                                       "blocks2"])
def test_tile_table_computes_every_group(cfg):
    """Emulate the kernel's view: each tile row's weight rows × token rows, stored where its epilogue stores."""
    gen = torch.Generator().manual_seed(4)
    m, n, k = (3, 0, 130, 70), (256, 96, 160, 128), (512, 256, 768, 256)

    def nv(rows, kk):
        c, s = _rand(rows, kk, gen, torch.tensor([0x38, 0x40], dtype=torch.uint8))
        return NVFP4Tensor(c, s.view(torch.float8_e4m3fn), 1.0)

    a = [nv(mm, kk) for mm, kk in zip(m, k)]
    b = [nv(nn, kk) for nn, kk in zip(n, k)]
    w = stack_weights([b], cfg.tile_m, cfg.tile_k)
    step = hopper_rs.token_step(cfg)
    offs, r = padded_row_offsets(m, step)
    assert all(o % step == 0 for o in offs)
    tiles = hopper_rs.swap_tile_table(m, w.n, w.k, offs, w.n_pad, cfg, 132, "cpu")
    assert tiles.shape[1] == len(WIDE_TILE_COLUMNS) and 0 not in {int(t[2]) for t in tiles}
    f64 = torch.float64
    x = torch.zeros((r, w.k_pad), dtype=f64)
    for g, o in enumerate(offs):
        x[o: o + m[g], : k[g]] = dequantize(a[g], f64)
    wt = dequantize(NVFP4Tensor(w.codes[0], w.scales[0].view(torch.float8_e4m3fn), 1.0), f64)
    c = torch.full((r, w.n_pad), float("nan"), dtype=f64)
    for _g, row0, tok, n0, nvalid, brow0, kt, var, k0, out0 in tiles.tolist():
        width = (var + 1) * step
        assert tok <= width <= cfg.tile_n
        ks = slice(k0 * cfg.tile_k, (k0 + kt) * cfg.tile_k)
        acc = wt[brow0: brow0 + cfg.tile_m, ks] @ x[row0: row0 + width, ks].T  # Cᵀ: weight rows × tokens
        c[out0: out0 + tok, n0: n0 + nvalid] = acc[:nvalid, :tok].T
    for g in range(len(m)):
        want = dequantize(a[g], f64) @ dequantize(b[g], f64).T
        assert torch.equal(c[offs[g]: offs[g] + m[g], : n[g]], want)


def test_activation_rows_point_into_the_callers_tensors():
    gen = torch.Generator().manual_seed(5)
    a = [NVFP4Tensor(*(lambda c, s: (c, s.view(torch.float8_e4m3fn)))(*_rand(mg, 256, gen)), 1.0) for mg in (3, 0, 5)]
    table = hopper_rs.activation_rows(a, (0, 8, 8), 16, "cpu")
    assert table[1, 0] == a[0].data.data_ptr() + 128 and table[2, 1] == a[0].scales.data_ptr() + 32
    assert table[3:8].abs().sum() == 0 and table[12, 2] == 16 and table[13, 2] == 0
    bad = NVFP4Tensor(a[0].data.t().contiguous().t(), a[0].scales, 1.0)
    with pytest.raises(ValueError, match="row-major"):
        hopper_rs.activation_rows([bad], (0,), 8, "cpu")


def test_group_parameters_give_the_row_tables_addresses():
    """The prologue's parameter form computes, for every padded row, what the row table holds (padding and an empty
    group included); past PARAM_GROUPS groups it falls back to the table."""
    gen = torch.Generator().manual_seed(6)
    a = [NVFP4Tensor(*(lambda c, s: (c, s.view(torch.float8_e4m3fn)))(*_rand(mg, 256, gen)), 1.0) for mg in (3, 0, 5)]
    offs, rows = (0, 8, 8), 16
    table = hopper_rs.activation_rows(a, offs, rows, "cpu")
    params = [int(v) for v in hopper_rs.group_parameters(a, offs)]
    per = len(hopper_rs.GROUP_PARAMS)
    assert len(params) == per * len(a)
    for r in range(rows):
        got = (0, 0, 0)
        for g in range(len(a)):  # what ActivationPrologueSm90._group_row computes
            ca, sa, cs, ss, r0, n, ch = params[g * per: (g + 1) * per]
            if r0 <= r < r0 + n:
                got = (ca + (r - r0) * cs, sa + (r - r0) * ss, ch)
        assert got == tuple(int(v) for v in table[r]), r
    assert hopper_rs.group_parameters(a * 6, (0,) * 18) == ()  # 18 groups > PARAM_GROUPS
    assert hopper_rs.group_parameters(a, offs, param_groups=2) == ()  # a config's param_groups


@pytest.mark.parametrize("cfg, rule", [
    (RS.with_(tile_m=64), "tile_m"),
    (RS.with_(tile_m=256, dual=True), "tile_m"),
    (RS.with_(tile_n=100), "multiple of 8"),
    (RS.with_(tile_n=256, tile_m=256), "accumulator registers"),
    (RS.with_(tile_k=64), "tile_k"),
    (RS.with_(tile_k=256, tile_m=256, tile_n=64, ab_stages=2), "TMA box"),
    (RS.with_(ab_stages=6), "shared memory"),
    (RS.with_(token_step=24), "token_step"),
    (RS.with_(tile_n=256, token_step=16, ab_stages=3), "token_step"),
    (RS.with_(epilogue="tma"), "epilogue"),
    (RS.with_(ab_stages=1, epilogue="staged"), "staged output tile"),  # 34.8 KB of output in 32 KB of buffers
    (RS.with_(dual=True, ab_stages=1), "dual hand-over"),  # 64 KB of up accumulators in 32 KB
    (RS.with_(prologue_smem=1 << 20), "prologue_smem"),
    (RS.with_(cta_overhead_tokens=-1), "cta_overhead_tokens"),
])
def test_impossible_swap_configs_are_refused(cfg, rule):
    with pytest.raises(ValueError, match=rule):
        hopper.validate(cfg)
    with pytest.raises(ValueError, match=rule):
        hopper.compile_report(cfg)


def test_named_swap_configs_follow_the_operands():
    """A config names its single-GEMM CTA; the dual GEMM covers half the rows of each of gate and up."""
    assert get_config("rs_m128_t128_k128_s4", dual=True).tile_m == 64
    assert get_config("rs_dual_m128_t128_k128_s4", dual=False).tile_m == 256
    with pytest.raises(ValueError, match="auto"):
        get_config("auto", dual=False)
    for dual, names in AUTO_CANDIDATES.items():
        assert all(n in RS_CONFIGS and isinstance(get_config(n, dual=dual), RSConfig) for n in names)
    assert hopper.DEFAULT_SINGLE == hopper.DEFAULT_DUAL == "auto"
    # what the one-call paths and the harness name without timing (nvfp4lib.api, nvfp4lib.compat) is shipped
    assert {"rs_m128_t128_k128_s3_e", "rs_dual_m128_t128_k128_s3"} <= set(CONFIGS)
