"""Every shipped cute-hopper config compiles for sm_90a here (no GPU) and its PTX shows what it claims."""
import pytest

from nvfp4lib.kernels.config import KernelConfig
from nvfp4lib.kernels.hopper import CONFIGS, SWEEP_CONFIGS, compile_report, get_config
from nvfp4lib.kernels.sm90 import smem_plan, validate


@pytest.fixture(scope="module")
def reports():
    return {name: compile_report(cfg) for name, cfg in CONFIGS.items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_shipped_config_compiles_with_tma_and_wgmma(reports, name):
    r = reports[name]
    assert r["wgmma.mma_async"] > 0, "no wgmma in the PTX"
    assert r["cp.async.bulk.tensor"] > 0, "no TMA load in the PTX"
    assert r["registers"] and r["registers"] <= 255
    assert r["spill_stores"] == 0 and r["spill_loads"] == 0, f"{name} spills"
    assert r["smem_bytes"] <= 232448


def test_dual_issues_twice_the_wgmmas_and_more_tma(reports):
    single = compile_report(CONFIGS["tile128x64"])
    dual = reports["baseline_dual"]
    assert dual["wgmma.mma_async"] == 2 * single["wgmma.mma_async"]
    assert dual["cp.async.bulk.tensor"] > single["cp.async.bulk.tensor"]


def test_baseline_is_the_studys_shape():
    b = CONFIGS["baseline"]
    assert (b.tile_m, b.tile_n, b.tile_k, b.ab_stages, b.epilogue, b.warp_spec) == (128, 128, 256, 1, "simt", "none")
    # 36 KB of packed operands and scales per stage: the panel's "~36 KB per stage" holds
    plan = smem_plan(b)
    assert plan["packed_a"] + plan["packed_b"] + plan["scales"] == 36864


@pytest.mark.parametrize("cfg, rule", [
    (KernelConfig("x", tile_m=96), "tile_m"),
    (KernelConfig("x", tile_n=100), "multiple of 8"),
    (KernelConfig("x", tile_k=128), "multiple of 256"),
    (KernelConfig("x", ab_stages=3), "shared memory"),
    (KernelConfig("x", tile_n=256), "accumulator registers"),
    (KernelConfig("x", dual=True), "accumulator registers"),
    (KernelConfig("x", epilogue="tma"), "not implemented"),
    (KernelConfig("x", warp_spec="pingpong"), "not implemented"),
])
def test_impossible_configs_are_refused_before_compiling(cfg, rule):
    with pytest.raises(ValueError, match=rule):
        validate(cfg)


def test_unknown_config_name():
    with pytest.raises(ValueError, match="unknown cute-hopper config"):
        get_config("nope", dual=False)


def test_sweep_includes_refused_study_configs():
    assert {"stages3", "stages4", "tma_epilogue", "producer_consumer", "pingpong"} <= set(SWEEP_CONFIGS)
