"""cute-hopper without a GPU: every shipped config compiles for sm_90a and its PTX shows what it claims;
impossible configs are refused before compiling; the decode's bit trick and the grouped layout are exact."""
import os

import pytest
import torch

from nvfp4lib.formats import NVFP4Tensor, dequantize
from nvfp4lib.kernels.common.packing import ActivationPacker, stack_weights, tile_table
from nvfp4lib.kernels.hopper_rs.config import RSConfig
from nvfp4lib.kernels.hopper_smem import kernel as hopper
from nvfp4lib.kernels.hopper_smem.config import SmemConfig
from nvfp4lib.kernels.hopper_smem.kernel import CONFIGS, SWEEP_CONFIGS, compile_report, get_config, smem_plan, validate

# a module fixture shared by this file's tests: they run in one pytest-xdist worker, so it is built once
pytestmark = pytest.mark.xdist_group("test_hopper_compile")

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """One compile per shipped config, shared by the tests below (~2-5 s each on 2 cores)."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    root = tmp_path_factory.mktemp("hopper-ptx")
    return {name: compile_report(cfg, dump_dir=str(root / name)) for name, cfg in CONFIGS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_shipped_config_compiles_with_tma_and_wgmma(reports, name):
    r = reports[name]
    assert os.path.exists(r["ptx_path"])
    assert r["wgmma.mma_async"] > 0, "no wgmma in the PTX"
    assert r["cp.async.bulk.tensor"] > 0, "no TMA load in the PTX"
    assert r["registers"] and r["registers"] <= 255
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, f"{name} spills"
    assert r["stack_frame"] == 0
    assert r["smem_bytes"] <= hopper.SMEM_LIMIT
    cfg = CONFIGS[name]
    if isinstance(cfg, RSConfig):
        from nvfp4lib.kernels.hopper_rs import runner as hopper_rs

        assert r["cvt.rn.f16x2.e4m3x2"] > 0 and r["lop3.b32"] > 0, "the register decode is missing"
        assert not r["wgmma_serialized"], "ptxas serialised the wgmma pipeline (C7513)"
        assert r["threads"] == 256 and r["bar.arrive"] == 0
        assert r["griddepcontrol.wait"] >= 1, "the GEMM does not wait for the prologue's grid"
        assert r["st.shared.v4.b32"] == 0 and r["ld.global.nc.v2.b32"] == 0  # activations arrive by TMA only
        if not cfg.dual:  # decoded weights never go through shared memory (the dual hands accumulators over)
            assert r["st.shared"] == (r["st.shared.b16"] if cfg.epilogue == "staged" else 0) + r["st.shared.v4.b32"]
        if cfg.epilogue == "staged":  # the output leaves in 16-byte row chunks, never element by element
            assert r["st.global.v4.b32"] >= 1 and r["st.global.b16"] == 0
        variants = cfg.tile_n // hopper_rs.token_step(cfg)
        assert r["wgmma.mma_async"] == variants * cfg.tile_k // 64 * hopper_rs.blocks_per_warpgroup(cfg) * 4
        return
    assert r["cvt.rn.f16x2.e4m3x2"] > 0 and r["prmt.b32"] > 0, "the decode is missing"
    assert not r["setmaxnreg_ignored"]
    if cfg.epilogue == "tma":  # TMA loads in prologue + main loop, and the store
        assert r["cp.async.bulk.tensor"] > reports["baseline"]["cp.async.bulk.tensor"]
    if cfg.warp_spec == "producer_consumer" and cfg.tile_m == 128:
        assert r["setmaxnreg"] == 2 and r["threads"] == 128 * 3


@pytest.mark.slow
def test_dual_issues_twice_the_wgmmas_and_loads_b2(reports, tmp_path):
    dual = reports["baseline_dual"]  # 128x64 tiles
    single = compile_report(CONFIGS["baseline"].with_(name="tile128x64", tile_n=64), dump_dir=str(tmp_path))
    assert dual["wgmma.mma_async"] == 2 * single["wgmma.mma_async"]
    assert dual["cp.async.bulk.tensor"] == single["cp.async.bulk.tensor"] * 3 // 2


def test_baseline_is_the_studys_shape():
    b = CONFIGS["baseline"]
    assert (b.tile_m, b.tile_n, b.tile_k, b.ab_stages, b.epilogue, b.warp_spec) == (128, 128, 256, 1, "simt", "none")
    assert hopper.threads_for(b) == 128
    # 36 KB of packed operands and scales per stage: the panel's "~36 KB per stage" holds
    assert smem_plan(b)["per_stage"] == 36864


def test_every_shipped_config_is_valid_and_fits():
    from nvfp4lib.kernels.hopper_rs import runner as hopper_rs

    for cfg in CONFIGS.values():
        assert validate(cfg) is cfg
        assert (hopper_rs.smem_plan if isinstance(cfg, RSConfig) else smem_plan)(cfg)["total"] <= hopper.SMEM_LIMIT


def test_each_family_ships_its_own_config_with_only_its_knobs():
    """The smem-decode kernel's configs are SmemConfig, the register-decode kernel's RSConfig (named rs_*); neither
    carries the other's knobs, and the variants that lost and the ablations are not shipped."""
    smem = {"family", "name", "tile_m", "tile_n", "tile_k", "ab_stages", "epilogue", "warp_spec", "decode", "split_k",
            "dual"}
    rs = {"family", "name", "tile_m", "tile_n", "tile_k", "ab_stages", "token_step", "epilogue", "dual",
          "cta_overhead_tokens", "prologue_smem", "param_groups"}
    for name, cfg in CONFIGS.items():
        assert set(cfg.as_dict()) == (rs if isinstance(cfg, RSConfig) else smem), name
        assert isinstance(cfg, RSConfig) == name.startswith("rs_"), name
        assert not any(name.endswith(s) for s in ("_dw", "_pp", "_i", "_no_dequant", "_no_mma", "_timeline")), name
    assert {"baseline", "baseline_dual", "stages3", "tile64x64", "tma_epilogue", "producer_consumer"} <= set(CONFIGS)
    with pytest.raises(ValueError, match="f7c5079"):
        get_config("rs_m128_t128_k128_s4_pp", dual=False)


@pytest.mark.parametrize("cfg, rule", [
    (SmemConfig("x", tile_m=96), "tile_m"),
    (SmemConfig("x", tile_m=256), "tile_m"),
    (SmemConfig("x", tile_n=100), "multiple of 8"),
    (SmemConfig("x", tile_n=264), "multiple of 8"),
    (SmemConfig("x", tile_n=72), "multiple of 32"),
    (SmemConfig("x", tile_k=128), "multiple of 16 bytes"),
    (SmemConfig("x", ab_stages=0), "ab_stages"),
    (SmemConfig("x", ab_stages=5), "shared memory"),
    (SmemConfig("x", tile_n=256), "accumulator registers"),
    (SmemConfig("x", dual=True), "accumulator registers"),
    (SmemConfig("x", warp_spec="pingpong"), "not implemented"),
    (SmemConfig("x", epilogue="smem"), "epilogue"),
])
def test_impossible_configs_are_refused_before_compiling(cfg, rule):
    with pytest.raises(ValueError, match=rule):
        validate(cfg)
    with pytest.raises(ValueError, match=rule):
        compile_report(cfg)  # refused before any compile


def test_unknown_config_name():
    with pytest.raises(ValueError, match="unknown cute-hopper config"):
        get_config("nope", dual=False)


def test_named_config_takes_dual_from_the_operands():
    assert get_config("baseline_dual", dual=True).dual
    with pytest.raises(ValueError, match="accumulator registers"):
        get_config("baseline", dual=True)  # 128x128 with two accumulators on one warpgroup


def test_sweep_lists_the_studys_refused_candidates():
    assert {"pingpong", "tile128x128x128"} <= set(SWEEP_CONFIGS)
    assert not set(SWEEP_CONFIGS) & set(CONFIGS)


def test_prepare_refuses_without_a_hopper_gpu():
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("this machine has an sm_90 GPU")
    a = NVFP4Tensor(torch.zeros(4, 128, dtype=torch.uint8), torch.ones(4, 16).to(torch.float8_e4m3fn), 1.0)
    with pytest.raises(RuntimeError, match="sm_90"):
        hopper.prepare([a], [a], None)
    with pytest.raises(ValueError, match="float16"):
        hopper.prepare([a], [a], None, out_dtype=torch.float32)


# --- the decode's arithmetic, emulated bit for bit -------------------------------------------
def test_decode_is_exact_for_every_code_pair_and_scale():
    """Every code byte (both nibbles) × every finite E4M3 scale byte, as the kernel's PTX computes it."""
    scales = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    gen = torch.Generator().manual_seed(0)
    for sb in range(256):
        if sb & 0x7F == 0x7F:  # NaN scales are refused before the kernel
            continue
        words = [0x76543210, 0xFEDCBA98, 0x0F1E2D3C] + [int(x) for x in torch.randint(0, 2**31, (2,), generator=gen)]
        if sb % 16 == 0:
            words += [b | (b << 8) | (b << 16) | (b << 24) for b in range(256)]
        for w in words:
            got = hopper.emulate_decode(w, sb)
            want = []
            for j in range(4):
                byte = (w >> (8 * j)) & 0xFF
                for code in (byte & 0xF, byte >> 4):
                    v = (-1.0 if code & 8 else 1.0) * E2M1[code & 7]
                    want.append(v * float(scales[sb]) * 2.0**hopper.OPERAND_EXPONENT)
            assert got == want, (hex(w), hex(sb))


# --- the grouped layout ----------------------------------------------------------------------
def _rand_nvfp4(rows, k, gen):
    data = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=gen)
    sc = torch.randint(1, 3, (rows, k // 16), generator=gen).float().to(torch.float8_e4m3fn)
    return NVFP4Tensor(data, sc, torch.tensor(0.5))


def test_grouped_layout_reproduces_every_group_exactly():
    """Emulate the kernel's view of the layout on the CPU: every tile's product equals the group's."""
    gen = torch.Generator().manual_seed(1)
    m, n, k = (3, 0, 130), (256, 96, 160), (512, 256, 768)
    tm, tn, tk = 128, 64, 256
    a = [_rand_nvfp4(mm, kk, gen) for mm, kk in zip(m, k)]
    b = [_rand_nvfp4(nn, kk, gen) for nn, kk in zip(n, k)]
    w = stack_weights([b], tn, tk)
    assert (w.n_pad, w.k_pad) == (256, 768)
    p = ActivationPacker(m, k, w.k_pad, tm, "cpu")
    gs = p(a)
    assert torch.equal(gs, torch.full((3,), 0.5))
    tiles = tile_table(m, w.n, w.k, p.row_offsets, w.n_pad, tm, tn, tk, "cpu")
    assert all(o % tm == 0 for o in p.row_offsets)
    f64 = torch.float64  # every sum here is exact in fp64, whatever the order
    a_all = dequantize(NVFP4Tensor(p.codes, p.scales.view(torch.float8_e4m3fn), 1.0), f64)
    b_all = dequantize(NVFP4Tensor(w.codes[0], w.scales[0].view(torch.float8_e4m3fn), 1.0), f64)
    c = torch.full((p.rows, w.n_pad), float("nan"), dtype=f64)
    for _g, row0, mv, n0, nv, brow0, kt, _ in tiles.tolist():
        acc = a_all[row0: row0 + tm, : kt * tk] @ b_all[brow0: brow0 + tn, : kt * tk].T
        c[row0: row0 + mv, n0: n0 + nv] = acc[:mv, :nv]
    assert {t[0] for t in tiles.tolist()} == {0, 2}  # the empty group has no tiles
    for g in range(3):
        want = dequantize(a[g], f64) @ dequantize(b[g], f64).T / 0.25
        got = c[p.row_offsets[g]: p.row_offsets[g] + m[g], : n[g]]
        assert torch.equal(got, want) if m[g] else got.shape == (0, n[g])


def test_packer_refuses_other_shapes_and_nan_scales_are_refused():
    gen = torch.Generator().manual_seed(2)
    a = [_rand_nvfp4(5, 256, gen)]
    p = ActivationPacker((4,), (256,), 256, 64, "cpu")
    with pytest.raises(ValueError, match="prepared for"):
        p(a)
    bad = _rand_nvfp4(8, 256, gen)
    bad.scales.view(torch.uint8)[0, 0] = 0x7F
    with pytest.raises(ValueError, match="NaN"):
        stack_weights([[bad]], 64, 256)


def test_split_k_slices_sum_to_every_group_exactly():
    """The split-K tile table on the CPU: each slice's partial product lands in its workspace block, the
    blocks' sum is the group's product (the kernel's fp32 partials, emulated exactly in fp64)."""
    from nvfp4lib.kernels.common.packing import WIDE_TILE_COLUMNS, split_ranges

    gen = torch.Generator().manual_seed(3)
    m, n, k = (70, 5), (128, 64), (1024, 768)
    tm, tn, tk, split = 64, 64, 256, 3
    a = [_rand_nvfp4(mm, kk, gen) for mm, kk in zip(m, k)]
    b = [_rand_nvfp4(nn, kk, gen) for nn, kk in zip(n, k)]
    w = stack_weights([b], tn, tk)
    p = ActivationPacker(m, k, w.k_pad, tm, "cpu")
    p(a)
    tiles = tile_table(m, w.n, w.k, p.row_offsets, w.n_pad, tm, tn, tk, "cpu", split_k=split, rows=p.rows,
                       wide=True)
    assert tiles.shape[1] == len(WIDE_TILE_COLUMNS)
    assert split_ranges(4, 3) == [(0, 1), (1, 1), (2, 2)]
    f64 = torch.float64
    a_all = dequantize(NVFP4Tensor(p.codes, p.scales.view(torch.float8_e4m3fn), 1.0), f64)
    b_all = dequantize(NVFP4Tensor(w.codes[0], w.scales[0].view(torch.float8_e4m3fn), 1.0), f64)
    work = torch.zeros((split * p.rows, w.n_pad), dtype=f64)
    for _g, row0, mv, n0, nv, brow0, kt, _, k0, out0 in tiles.tolist():
        ks = slice(k0 * tk, (k0 + kt) * tk)
        acc = a_all[row0: row0 + tm, ks] @ b_all[brow0: brow0 + tn, ks].T
        work[out0: out0 + mv, n0: n0 + nv] += acc[:mv, :nv]
    total = work.view(split, p.rows, -1).sum(0)
    for g in range(2):
        want = dequantize(a[g], f64) @ dequantize(b[g], f64).T / 0.25
        assert torch.equal(total[p.row_offsets[g]: p.row_offsets[g] + m[g], : n[g]], want)
    with pytest.raises(ValueError, match="exceeds"):
        tile_table(m, w.n, (256, 256), p.row_offsets, w.n_pad, tm, tn, tk, "cpu", split_k=2, rows=p.rows, wide=True)


def test_auto_split_k_only_where_the_tiles_do_not_fill_the_gpu():
    cfg = CONFIGS["tile64x128_stages2_tma_batched_auto"]
    assert hopper.choose_split_k(cfg, (1,), (4096,), (7168,), 132) == 8  # 32 tiles: split
    assert hopper.choose_split_k(cfg, (1,) * 8, (4096,) * 8, (7168,) * 8, 132) == 1  # 256 tiles: no
    assert hopper.choose_split_k(cfg, (64,), (7168,), (2048,), 132) == 1  # 56 tiles: more than a quarter
    assert hopper.choose_split_k(cfg, (8,), (4096,), (256,), 132) == 1  # one K tile: nothing to split
    assert hopper.choose_split_k(cfg.with_(split_k=3), (8,), (4096,), (512,), 132) == 2  # clipped to K tiles
    with pytest.raises(ValueError, match="SIMT"):
        validate(SmemConfig("x", split_k=2, epilogue="tma"))


def test_sass_counts_say_why_without_cuobjdump(monkeypatch):
    from nvfp4lib.kernels.common import compiling

    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    assert "cuobjdump not found" in compiling.sass_counts("k.cubin")["sass"]


@pytest.mark.parametrize("param_groups", [0, 2, 16])
def test_activation_prologue_compiles(param_groups):
    """The prologue of the prologue-mode swap-AB configs: it releases the GEMM at once (PDL) and decodes with the
    conversion instruction; up to PARAM_GROUPS groups it takes their addresses as kernel parameters and loads no row
    table (three 8-byte loads per row otherwise)."""
    from nvfp4lib.kernels.hopper_rs import runner as hopper_rs

    r = hopper_rs.prologue_report(param_groups)
    assert r["griddepcontrol.launch_dependents"] == 1
    assert r["params"] == len(hopper_rs.GROUP_PARAMS) * param_groups
    assert r["ld.global.nc.u64"] == (0 if param_groups else 3)
    assert r["cvt.rn.f16x2.e4m3x2"] >= 1 and r["ld.global.nc.v2.b32"] >= 1 and r["st.global.v4.b32"] >= 1
    assert r["spill_stores"] == 0
    # a config's prologue_smem is what the launch asks for; the kernel's code is the same
    assert hopper_rs.prologue_report(param_groups, smem=0)["cvt.rn.f16x2.e4m3x2"] == r["cvt.rn.f16x2.e4m3x2"]
