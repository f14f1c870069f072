"""The Blackwell kernel (compiled for sm_100a, not run): every shipped config compiles here, without a
GPU, and its PTX holds the instructions it claims; the host-side helpers are checked on the CPU."""
import pytest
import torch

from nvfp4lib.formats import swizzle_scales
from nvfp4lib.kernels.blackwell import runner as bw
from nvfp4lib.problems import get_problem, make_inputs

# a module fixture shared by this file's tests: they run in one pytest-xdist worker, so it is built once
pytestmark = pytest.mark.xdist_group("test_blackwell_compile")

SHIPPED = [(name, dual) for name in bw.CONFIGS for dual in (False, True)]


@pytest.fixture(scope="module")
def reports():
    """One compile per shipped config and variant, shared by the tests below (~2 s each)."""
    return {(name, dual): bw.compile_report(cfg.with_(dual=dual), keep_ptx=True)
            for name, cfg in bw.CONFIGS.items() for dual in (False, True)}


@pytest.mark.parametrize("name, dual", SHIPPED)
def test_shipped_config_compiles_for_sm100a_with_the_claimed_instructions(reports, name, dual):
    r = reports[(name, dual)]
    assert "error" not in r, r.get("error")
    assert r["label"] == "compiled for sm_100a, not run"
    ptx = r["ptx"]
    assert "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale" in ptx
    assert r["tcgen05.mma kind"] == "mxf4nvf4"
    assert r["cp.async.bulk.tensor"] > 0 and "cp.async.bulk.tensor" in ptx
    assert r["tcgen05.ld"] > 0 and r["tcgen05.cp"] > 0
    assert "tcgen05.alloc" in ptx and "tcgen05.dealloc" in ptx
    # the descriptors are re-pointed on the device, per group
    assert "tensormap.replace.tile.global_address" in ptx
    assert f".reqntid {bw.threads_per_cta(bw.CONFIGS[name])}, 1, 1" in ptx
    assert r["registers"] and r["registers"] <= 255
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, f"{name} dual={dual} spills"
    assert r["smem_plan_agrees"] and r["tmem_plan_agrees"], "Python plans disagree with the kernel's struct"
    assert r["smem_fits"] and r["dynamic_smem"] + r["static_smem"] <= bw.SMEM_PER_BLOCK_MAX
    assert r["tmem_cols_used"] <= bw.TMEM_COLUMNS
    assert r["ctas_per_sm"] >= 1


def test_dual_issues_two_mmas_per_kblock_and_loads_b2(reports):
    for name in bw.CONFIGS:
        single, dual = reports[(name, False)], reports[(name, True)]
        assert dual["tcgen05.mma"] == 2 * single["tcgen05.mma"]
        assert dual["cp.async.bulk.tensor"] == single["cp.async.bulk.tensor"] + 2  # B2 and its scales
        assert "ex2.approx" in dual["ptx"] and "ex2.approx" not in single["ptx"]  # SiLU's exp


def test_baseline_is_the_studys_kernel(reports):
    b = bw.CONFIGS["baseline"]
    assert (b.tile_m, b.tile_n, b.tile_k, b.ab_stages, b.acc_stages, b.epilogue, b.warp_spec) == \
        (128, 128, 256, 1, 1, "simt", "none")
    r = reports[("baseline", False)]
    assert r["threads"] == 128
    # SIMT epilogue: one tcgen05.ld of the whole 128-column row per thread, scalar global stores
    assert r["tcgen05.ld forms"] == "tcgen05.ld.sync.aligned.32x32b.x128.b32"
    assert r["st.global forms"] and "cp.async.bulk.tensor.2d.global.shared::cta" not in r["ptx"]
    # 36 KB of packed operands and scales per stage: the panel's "~36 KB per stage" holds
    assert r["smem_per_stage"] == 36864 == r["tma_bytes_per_stage"]


def test_ws_pipelined_is_warp_specialized_with_a_tma_store(reports):
    r = reports[("ws_pipelined", False)]
    assert r["threads"] == 192
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in r["ptx"]  # TMA store of C
    assert r["mbarrier.try_wait"] > reports[("baseline", False)]["mbarrier.try_wait"]


def test_registers_do_not_grow_with_stages():
    """Round 1's "register pressure from 3x buffer state": stages live in shared memory."""
    regs = {s: bw.compile_report(bw.SWEEP_CONFIGS[f"r1_stages{s}"])["registers"] for s in (1, 3)}
    assert regs[1] == regs[3]


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name", ["r2_tile64x128", "r2_tile64x64"])
def test_the_studys_64_row_tiles_are_refused_with_the_compilers_message(name):
    cfg = bw.SWEEP_CONFIGS[name]
    with pytest.raises(ValueError, match="expects the M-mode to be 128, but got 64"):
        bw.validate(cfg)
    row = bw.compile_report(cfg)  # a row, not an exception
    assert "expects the M-mode to be 128, but got 64" in row["error"]
    assert row["rejected_by"] == "hardware MMA shape (CuTe DSL)"


def test_2cta_64_row_tiles_are_refused_by_the_scale_factor_layout():
    with pytest.raises(ValueError, match="lays out B's scale factors"):
        bw.validate(bw.SWEEP_CONFIGS["r2_tile64x128_2cta"])


@pytest.mark.parametrize("cfg, rule", [
    (bw.BlackwellConfig("x", tile_k=128), "tile_k must be 256"),
    (bw.BlackwellConfig("x", tile_n=96), "tile_n in"),
    (bw.BlackwellConfig("x", tile_n=256, dual=True), "tensor-memory columns"),
    (bw.BlackwellConfig("x", ab_stages=5, dual=True), "shared memory"),
    (bw.BlackwellConfig("x", use_2cta=True, cluster_m=2), "warp_spec='producer_consumer'"),
    (bw.BlackwellConfig("x", warp_spec="pingpong"), "not implemented"),
    (bw.BlackwellConfig("x", warp_spec="producer_consumer", use_2cta=True), "cluster_m even"),
])
def test_impossible_configs_are_refused_before_compiling(cfg, rule):
    with pytest.raises(ValueError, match=rule):
        bw.validate(cfg)


def test_config_holds_only_this_kernels_knobs():
    fields = set(bw.CONFIGS["baseline"].as_dict())
    assert fields == {"family", "name", "tile_m", "tile_n", "tile_k", "ab_stages", "acc_stages", "epilogue",
                      "warp_spec", "dual", "use_2cta", "cluster_m", "cluster_n"}
    assert set(bw.CONFIGS) == {"baseline", "ws_pipelined"}


def test_sweep_holds_the_studys_candidates():
    names = set(bw.SWEEP_CONFIGS)
    assert {f"r1_stages{s}" for s in (1, 2, 3, 4)} <= names
    for m, n in ((64, 128), (64, 64), (128, 64), (128, 256)):
        assert {f"r2_tile{m}x{n}", f"r2_tile{m}x{n}_2cta"} <= names


def test_unknown_config_name():
    with pytest.raises(ValueError, match="unknown cute-blackwell config"):
        bw.compile_report("nope")


# --------------------------------------------------------------------------- prepare refuses
def _small_inputs(dual=False):
    p = get_problem("C1").with_dual(dual)
    inp = make_inputs(p)
    return inp.a, inp.b, inp.b2


def test_prepare_refuses_without_a_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    a, b, b2 = _small_inputs()
    with pytest.raises(RuntimeError, match="needs sm_100.*found no CUDA device"):
        bw.prepare(a, b, None)
    with pytest.raises(RuntimeError, match="found no CUDA device"):
        bw.prepare(*_small_inputs(dual=True))


def test_prepare_refuses_hopper_naming_the_architecture(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    with pytest.raises(RuntimeError, match="needs sm_100, found sm_90 \\(NVIDIA H100"):
        bw.require_sm100(torch.device("cuda", 0))
    a, b, _ = _small_inputs()  # CPU operands on a machine that has a GPU
    with pytest.raises(RuntimeError, match="operands on cpu"):
        bw.prepare(a, b, None)


# --------------------------------------------------------------------------- host helpers
@pytest.mark.parametrize("rows, k", [(1, 64), (128, 256), (200, 320), (72, 1024)])
def test_cutlass_scale_layout_is_formats_swizzle_scales(rows, k):
    """The layout the kernel's scale-factor TMA descriptors are built from (CUTLASS's
    tile_atom_to_shape_SF, evaluated while tracing) addresses swizzle_scales' output exactly."""
    offsets = bw.cutlass_scale_offsets(rows, k)
    s = torch.randint(0, 256, (rows, k // 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(rows))
    blocked = swizzle_scales(s)
    assert offsets.shape == (rows, k // 16)
    assert int(offsets.max()) < blocked.numel()
    assert torch.equal(blocked[offsets], s)


def test_problem_tables_hold_sizes_addresses_and_global_scale_products():
    p = get_problem("C4").with_dual(True)
    inp = make_inputs(p)

    def prep(t, gs):
        return {"data": t.data, "sf": swizzle_scales(t.scales), "global_scale": torch.tensor(gs)}

    a = [prep(t, 0.5) for t in inp.a]
    b = [prep(t, 2.0) for t in inp.b]
    b2 = [prep(t, 4.0) for t in inp.b2]
    c = [torch.empty((m, n), dtype=torch.float16) for m, n in zip(p.m, p.n)]
    t = bw.problem_tables(a, b, c, b2)
    assert t["sizes"].dtype == torch.int32 and t["sizes"].shape == (3, 4)
    assert t["sizes"].tolist() == [[m, n, k, 1] for m, n, k in zip(p.m, p.n, p.k)]
    assert t["addresses"].shape == (3, bw.NUM_ADDR) and t["addresses"].dtype == torch.int64
    g = 1
    assert t["addresses"][g, bw.ADDR_A] == a[g]["data"].data_ptr()
    assert t["addresses"][g, bw.ADDR_C] == c[g].data_ptr()
    assert t["addresses"][g, bw.ADDR_SFB2] == b2[g]["sf"].data_ptr()
    assert torch.equal(t["alphas"], torch.tensor([[1.0, 2.0]] * 3))


# The study's shapes: per-group M tiles of 128 rows, N tiles of 128, K tiles of 256.
@pytest.mark.parametrize("shape, tiles, k_tiles", [("S1", 11 * 32, 28), ("S2", 13 * 56, 8),
                                                   ("S3", 5 * 24, 16), ("S4", 4 * 32, 6)])
def test_tile_counts_per_shape(shape, tiles, k_tiles):
    p = get_problem(shape)
    t = bw.tile_counts(list(zip(p.m, p.n, p.k)), bw.CONFIGS["baseline"])
    assert t["ctas"] == t["clusters"] == tiles
    assert set(t["k_tiles"]) == {k_tiles}
    useful = sum(m * n for m, n in zip(p.m, p.n))
    assert t["wasted_mma_fraction"] == pytest.approx(1 - useful / (tiles * 128 * 128))


def test_2cta_clusters_and_tensormap_workspace():
    p = get_problem("S1")
    sizes = list(zip(p.m, p.n, p.k))
    cfg2 = bw.SWEEP_CONFIGS["r2_tile128x256_2cta"]
    t = bw.tile_counts(sizes, cfg2)
    # a cluster covers 256 rows x 256 columns: one M cluster per group, 16 N clusters
    assert t["clusters"] == 8 * 16 and t["ctas"] == 2 * t["clusters"]
    base = bw.CONFIGS["baseline"]
    # the study's structure: one CTA per tile, each with its own 4 descriptors
    assert bw.tensormap_workspace_bytes(base, 352) == 352 * 4 * 128
    assert bw.tensormap_workspace_bytes(base.with_(dual=True), 352) == 352 * 6 * 128
    # persistent: one CTA per SM (148 on a B200), 5 descriptors (A, B, SFA, SFB, C)
    assert bw.tensormap_workspace_bytes(bw.CONFIGS["ws_pipelined"], 352) == 148 * 5 * 128
    rows = bw.shape_tile_table(base)
    assert [r["shape"] for r in rows] == ["S1", "S2", "S3", "S4"]
    assert rows[0]["tiles"] == 352 and rows[3]["sm_fraction"] == pytest.approx(128 / 148)


def test_storage_and_tmem_plans():
    base = bw.CONFIGS["baseline"]
    assert bw.storage_plan(base).per_stage == 36864
    assert bw.storage_plan(base.with_(dual=True)).per_stage == 55296
    assert bw.tmem_columns(base)["used"] == 128 + 32
    assert bw.tmem_columns(base.with_(dual=True))["used"] == 256 + 48
    occ = bw.ctas_per_sm(smem_bytes=37888, registers=146, threads=128, tmem_alloc=512)
    assert occ["by_tmem"] == 1 and occ["by_smem"] == 6 and occ["by_registers"] == 3 and occ["ctas_per_sm"] == 1
