"""The serving path without a GPU: both call forms exact on the reference backend, the custom op's fake and
opcheck, the tuning cache, bad input refused; and every config of the device-scheduled kernel compiles for sm_90a
with the instructions it claims."""
import os
import re
import types

import pytest
import torch

import nvfp4lib
from nvfp4lib import tuning
from nvfp4lib.formats import NVFP4Tensor, quantize
from nvfp4lib.kernels.hopper_varlen.config import CONFIGS, VarlenConfig, max_token_tiles, validate
from nvfp4lib.serving import check_offsets, prepare_weights


def _weights(g=3, n=64, k=128, seed=0):
    torch.manual_seed(seed)
    return [quantize(torch.randn(n, k)) for _ in range(g)]


@pytest.mark.parametrize("dual", [False, True])
def test_list_and_packed_forms_match_the_reference(dual):
    b, b2 = _weights(), (_weights(seed=1) if dual else None)
    a = [quantize(torch.randn(m, 128) * 3) for m in (5, 0, 7)]
    w = prepare_weights(b, b2, backend="reference")
    ref = nvfp4lib.reference_grouped_gemm(a, b, b2)
    for o, r in zip(w(a), ref):
        assert o.shape == r.shape and torch.allclose(o.float(), r.float(), rtol=1e-3, atol=1e-3)
    ap = NVFP4Tensor(torch.cat([t.data for t in a]), torch.cat([t.scales for t in a]), 1.0)
    gs = torch.stack([t.global_scale for t in a])
    c = w(ap, torch.tensor([0, 5, 5, 12], dtype=torch.int32), global_scale=gs)
    assert torch.allclose(c[:5].float(), ref[0].float(), rtol=1e-3, atol=1e-3)
    assert torch.allclose(c[5:].float(), ref[2].float(), rtol=1e-3, atol=1e-3)


def test_custom_op_compiles_and_passes_opcheck():
    w = prepare_weights(_weights(), backend="reference")
    ap = quantize(torch.randn(12, 128))
    off = torch.tensor([0, 4, 4, 12], dtype=torch.int32)
    gs = torch.ones(1)
    eager = w(ap, off, global_scale=gs)
    compiled = torch.compile(lambda x, o: w(x, o, global_scale=gs), fullgraph=True)
    assert torch.equal(compiled(ap, off), eager)
    torch.library.opcheck(torch.ops.nvfp4lib.grouped_mm, (ap.data, ap.scales.view(torch.uint8), gs, off, w.handle))
    # the op takes the scales as NVFP4Tensor holds them (E4M3, what w(a_packed, offsets) passes) or as their bytes
    # (opcheck's schema check compares inputs with a CPU multiply that torch 2.13 lacks for E4M3: the fake alone)
    torch.library.opcheck(torch.ops.nvfp4lib.grouped_mm, (ap.data, ap.scales, gs, off, w.handle),
                          test_utils=("test_faketensor", "test_autograd_registration"))
    assert ap.scales.dtype == torch.float8_e4m3fn
    assert torch.equal(torch.ops.nvfp4lib.grouped_mm(ap.data, ap.scales, gs, off, w.handle),
                       torch.ops.nvfp4lib.grouped_mm(ap.data, ap.scales.view(torch.uint8), gs, off, w.handle))



@pytest.mark.parametrize("dual", [False, True])
def test_operand_form_gives_the_packed_form(dual):
    """PreparedWeights.call_operand: activations decoded to the GEMM's fp16 operand (e2m1 · block scale · 2^-7) give
    the packed form's output on the same codes and scales; bad operands are refused with the rule."""
    from nvfp4lib.formats import e2m1_decode, unpack_e2m1

    w = prepare_weights(_weights(), _weights(seed=1) if dual else None, backend="reference")
    ap = quantize(torch.randn(12, 128) * 3)
    off, gs = torch.tensor([0, 4, 4, 12], dtype=torch.int32), torch.tensor([0.25])
    x16 = (e2m1_decode(unpack_e2m1(ap.data)) * ap.scales.float().repeat_interleave(16, dim=-1) / 128).half()
    assert w.operand_k == 128
    assert torch.equal(w.call_operand(x16, off, gs), w(ap, off, global_scale=gs))
    out = torch.empty(12, 64, dtype=torch.float16)
    assert w.call_operand(x16, off, gs, out=out) is out and torch.equal(out, w(ap, off, global_scale=gs))
    with pytest.raises(TypeError, match=r"fp16 tensor \[T, 128\]"):
        w.call_operand(x16.float(), off, gs)
    with pytest.raises(TypeError, match="global_scale"):
        w.call_operand(x16, off, None)
    with pytest.raises(TypeError, match="int32"):
        w.call_operand(x16, off.long(), gs)
    with pytest.raises(ValueError, match="contiguous"):
        w.call_operand(torch.zeros(128, 12, dtype=torch.float16).t(), off, gs)
    a16 = prepare_weights(_weights(), backend="reference", activations="bf16")
    assert a16.operand_k is None
    with pytest.raises(TypeError, match="activations='bf16'"):
        a16.call_operand(x16, off, gs)

def test_bad_input_is_refused_with_the_rule():
    w = prepare_weights(_weights(), backend="reference")
    ap = quantize(torch.randn(12, 128))
    with pytest.raises(TypeError, match="int32"):
        w(ap, torch.tensor([0, 4, 4, 12]))
    with pytest.raises(ValueError, match=r"\[G\+1\]"):
        w(ap, torch.tensor([0, 12], dtype=torch.int32))
    with pytest.raises(ValueError, match="K=256"):
        w(quantize(torch.randn(4, 256)), torch.tensor([0, 4, 4, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="3 NVFP4Tensor"):
        w([ap])
    with pytest.raises(ValueError, match="share N"):
        prepare_weights([quantize(torch.randn(64, 128)), quantize(torch.randn(32, 128))], backend="reference")
    with pytest.raises(ValueError, match="decrease"):
        check_offsets(torch.tensor([0, 5, 3, 12], dtype=torch.int32), 12)
    with pytest.raises(ValueError, match="past"):
        check_offsets(torch.tensor([0, 5, 5, 13], dtype=torch.int32), 12)


def test_tuning_candidates_leave_out_the_spin_wait():
    """config="auto" tunes among the configs of its layout with the hinted wait or a once-wait that a tier ships: the
    _w configs and the other _o configs are A/B arms (named configs), and every config the heuristic prefers stays a
    candidate."""
    from nvfp4lib.kernels.hopper_varlen.runner import layout_of
    from nvfp4lib.serving import auto_layout

    preferred = tuning.shipped()
    assert {c for _, names in tuning.PREFERENCE for c in names} <= preferred
    assert set(tuning.SHORT_K_TIER[1]) | set(tuning.TUNING_ARMS) <= preferred
    for dual, groups, n in ((False, 8, 4096), (True, 8, 4096), (True, 128, 768)):
        for act in ("nvfp4", "bf16"):
            layout, cands = auto_layout(dual, groups, n, act)
            assert cands and all(CONFIGS[c].wait == "suspend" or c in preferred for c in cands)
            assert not any(c.endswith("_w") for c in cands)
            assert not any(CONFIGS[c].wait == "once" and c not in preferred for c in cands)
            same = {c for c, cfg in CONFIGS.items() if layout_of(cfg) == layout and cfg.act == act}
            assert preferred & same <= set(cands)
    assert any(c.wait == "spin" for c in CONFIGS.values())  # (the arms exist, as named configs)
    assert all(c.endswith("_o") == (CONFIGS[c].wait == "once") for c in CONFIGS)  # (what tuning.heuristic reads)


def test_heuristic_takes_the_once_wait_where_shipped():
    """The single GEMM's study tiers take their _o config when it is a candidate (ONCE_WAIT), the hinted one with the
    knob off or where there is none (the bf16 configs); the decode tiers are unchanged, and the duals of 17-64 rows per
    group take the 96-token once-wait tiles (DUAL_96; the 256-token tiles above, with DUAL_96 = 0 or the knob off)."""
    from nvfp4lib.serving import auto_layout

    _, single = auto_layout(False, 8, 4096)
    _, dual = auto_layout(True, 8, 4096)
    assert tuning.heuristic(False, 128, single) == "vl_m128_t256_k128_s3_v32_e_o"
    assert tuning.heuristic(False, 256, single) == "vl_m128_t128_k128_s3_e_o"
    assert tuning.heuristic(False, 4, single) == "vl_m128_t16_k128_s8_e_x"
    assert tuning.DUAL_96 == 64
    assert tuning.heuristic(True, 64, dual) == "vl_dual_m64_t96_k128_s3_v32_e_o" == tuning.DUAL_96_CONFIG
    assert tuning.heuristic(True, 32, dual) == tuning.DUAL_96_CONFIG
    assert tuning.heuristic(True, 128, dual) == "vl_dual_m64_t256_k128_s3_v32_e"
    assert tuning.heuristic(True, 256, dual) == "vl_dual_m64_t96_k128_s3_e"  # (the tier above: unchanged)
    old = tuning.ONCE_WAIT
    try:
        tuning.DUAL_96 = 0
        assert tuning.heuristic(True, 64, dual) == "vl_dual_m64_t256_k128_s3_v32_e"
        tuning.DUAL_96 = 128
        assert tuning.heuristic(True, 128, dual) == tuning.DUAL_96_CONFIG
        tuning.ONCE_WAIT = False
        assert tuning.heuristic(True, 64, dual) == "vl_dual_m64_t256_k128_s3_v32_e"
        assert tuning.heuristic(False, 128, single) == "vl_m128_t256_k128_s3_v32_e"
        assert tuning.heuristic(False, 256, single) == "vl_m128_t128_k128_s3_e"
    finally:
        tuning.ONCE_WAIT, tuning.DUAL_96 = old, 64


def test_dual_96_k_takes_the_dual_96_token_tiles_at_65_128_rows_for_short_k(monkeypatch):
    """With tuning.DUAL_96_K set, dual GEMMs of K at most it take DUAL_96_CONFIG in the whole tier of 65-128 rows per
    group (S2-dual's K = 2048, shipped); longer K, the single GEMM, the tier above and unknown K are unchanged."""
    from nvfp4lib.serving import auto_layout

    _, single = auto_layout(False, 8, 7168)
    _, dual = auto_layout(True, 8, 7168)
    assert tuning.DUAL_96_K == 2048
    monkeypatch.setattr(tuning, "DUAL_96_K", 0)
    assert tuning.heuristic(True, 128, dual, k=2048) == "vl_dual_m64_t256_k128_s3_v32_e"
    monkeypatch.setattr(tuning, "DUAL_96_K", 2048)
    assert tuning.heuristic(True, 128, dual, k=2048) == tuning.DUAL_96_CONFIG
    assert tuning.heuristic(True, 128, dual, k=1536) == tuning.DUAL_96_CONFIG
    assert tuning.heuristic(True, 128, dual, k=4096) == "vl_dual_m64_t256_k128_s3_v32_e"
    assert tuning.heuristic(True, 128, dual) == "vl_dual_m64_t256_k128_s3_v32_e"
    assert tuning.heuristic(True, 256, dual, k=2048) == "vl_dual_m64_t96_k128_s3_e"
    assert tuning.heuristic(False, 128, single, k=2048) == "vl_m128_t256_k128_s3_v32_e_o"
    assert tuning.rule_knobs()["dual_96_k"] == 2048


def test_rule_choice_is_the_auto_call_s_choice_on_a_cache_miss():
    """serving.rule_choice (the prepared call's rule, the one-shot call's and the reports' rule_config share it): the
    bucket of the rows per group over the layout's candidates, the bf16 configs ranked as their NVFP4 mirrors; the
    study's S2-dual (8 groups, 1024 rows, K = 2048) takes DUAL_96_CONFIG, S1-dual (K = 7168) the 256-token tile."""
    from nvfp4lib.serving import rule_choice
    from nvfp4lib.study.serving_report import rule_config

    assert rule_choice(True, 8, 7168, 2048, 1024) == tuning.DUAL_96_CONFIG == rule_config("S2-dual")
    assert rule_choice(True, 8, 4096, 7168, 1024) == "vl_dual_m64_t256_k128_s3_v32_e" == rule_config("S1-dual")
    assert rule_choice(False, 8, 7168, 2048, 1024) == "vl_m128_t256_k128_s3_v32_e_o" == rule_config("S2")
    assert rule_choice(False, 128, 2048, 768, 8) == "vl_m128_t16_k128_s8_e_x"  # (decode: a row per group or less)
    assert rule_choice(False, 128, 2048, 768, 8, "bf16") == "vl_a16_m128_t16_k128_s8_e_x"
    assert rule_config("no-such-problem") is None


def test_rule_config_follows_the_rule_knobs(monkeypatch):
    """The reports' rule_config is remembered per problem and rule knobs: with DUAL_96_K off, S2-dual takes the
    256-token tile, and back at the shipped value DUAL_96_CONFIG again."""
    from nvfp4lib.study.serving_report import rule_config

    assert rule_config("S2-dual") == tuning.DUAL_96_CONFIG
    monkeypatch.setattr(tuning, "DUAL_96_K", 0)
    assert rule_config("S2-dual") == "vl_dual_m64_t256_k128_s3_v32_e"
    monkeypatch.setattr(tuning, "DUAL_96_K", 2048)
    assert rule_config("S2-dual") == tuning.DUAL_96_CONFIG


def test_short_k_rule_is_off_and_takes_96_token_tiles_when_on(monkeypatch):
    """The rule by K (tuning.SHORT_K) is shipped off (the MoE layers ran slower with it): every K takes the tier's
    256-token tiles. Switched on, at 65-128 rows per group (bucket 128) a K of at most SHORT_K takes the 96-token
    once-wait tiles in 32-token steps (S2, S2-dual), a longer K the tier's (S1, S1-dual); other buckets and the bf16
    configs are unchanged."""
    from nvfp4lib.serving import _CuteHopperImpl, auto_layout

    _, single = auto_layout(False, 8, 7168)
    _, dual = auto_layout(True, 8, 7168)
    monkeypatch.setattr(tuning, "DUAL_96_K", 0)  # (the dual rule by K: its own test)
    assert tuning.SHORT_K == 0
    assert tuning.heuristic(False, 128, single, k=2048) == "vl_m128_t256_k128_s3_v32_e_o"
    assert tuning.heuristic(True, 128, dual, k=2048) == "vl_dual_m64_t256_k128_s3_v32_e"
    assert set(tuning.SHORT_K_TIER[1]) <= set(single + dual)  # (tuning candidates: `nvfp4lib tune` takes them)
    monkeypatch.setattr(tuning, "SHORT_K", 4096)
    assert tuning.heuristic(False, 128, single, k=2048) == "vl_m128_t96_k128_s3_v32_e_o"
    assert tuning.heuristic(True, 128, dual, k=2048) == "vl_dual_m64_t96_k128_s3_v32_e_o"
    assert tuning.heuristic(False, 128, single, k=4096) == "vl_m128_t96_k128_s3_v32_e_o"
    assert tuning.heuristic(False, 128, single, k=7168) == "vl_m128_t256_k128_s3_v32_e_o"
    assert tuning.heuristic(True, 128, dual, k=7168) == "vl_dual_m64_t256_k128_s3_v32_e"
    assert tuning.heuristic(False, 64, single, k=2048) == "vl_m128_t256_k128_s3_v32_e_o"
    assert tuning.heuristic(False, 256, single, k=2048) == "vl_m128_t128_k128_s3_e_o"
    assert tuning.heuristic(False, 128, single) == "vl_m128_t256_k128_s3_v32_e_o"  # (K not given)
    fake = types.SimpleNamespace(activations="bf16", k=2048, weights=types.SimpleNamespace(dual=True),
                                 candidates=auto_layout(True, 8, 7168, "bf16")[1])
    assert _CuteHopperImpl._heuristic(fake, 128) == "vl_a16_dual_m64_t256_k128_s3_v32_e"
    monkeypatch.setattr(tuning, "ONCE_WAIT", False)  # (the rule names _o configs only)
    assert tuning.heuristic(False, 128, single, k=2048) == "vl_m128_t256_k128_s3_v32_e"


def test_tuning_cache_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("NVFP4LIB_CACHE", str(tmp_path))
    tuning.forget_memory()
    key = tuning.problem_key("H100", "cute-hopper", False, torch.float16, 8, 4096, 7168, 128)
    assert tuning.lookup(key) is None
    tuning.store(key, "vl_m128_t96_k128_s3_e")
    tuning.forget_memory()
    assert tuning.lookup(key) == "vl_m128_t96_k128_s3_e"
    assert os.path.exists(tmp_path / "tuning.json")
    tuning.forget_memory()
    assert tuning.m_bucket(1024, 8) == 128 and tuning.m_bucket(0, 8) == 1 and tuning.m_bucket(129, 1) == 256
    single = [n for n, c in CONFIGS.items() if not c.dual]
    assert tuning.heuristic(False, 128, single) == "vl_m128_t256_k128_s3_v32_e_o"
    assert tuning.heuristic(False, 256, single) == "vl_m128_t128_k128_s3_e_o"  # S3, S4: one wave
    assert tuning.heuristic(False, 512, single) == "vl_m128_t128_k128_s4_e"
    # decode tiers (a few rows per expert); a layout without decode tiles falls through to the next tier
    assert tuning.heuristic(False, 1, single) == "vl_m128_t16_k128_s8_e_x"
    assert tuning.heuristic(False, 16, single) == "vl_m128_t32_k128_s6_e"
    assert tuning.heuristic(False, 32, single) == "vl_m128_t256_k128_s3_v32_e_o"
    dual64 = [n for n, c in CONFIGS.items() if c.dual and c.tile_m == 64 and c.act == "nvfp4"]
    dual128 = [n for n, c in CONFIGS.items() if c.dual and c.tile_m == 128 and c.act == "nvfp4"]
    assert tuning.heuristic(True, 4, dual64) == "vl_dual_m64_t16_k128_s8_e_x"
    assert tuning.heuristic(True, 2, dual128) == "vl_dual_m128_t128_k128_s3"


def test_grid_covers_every_split():
    """The grid is sized for the worst split: no split of T rows over G groups needs more token tiles."""
    import itertools

    for rows, groups, tn in ((7, 3, 8), (20, 4, 8), (33, 2, 16)):
        worst = 0
        for cuts in itertools.combinations_with_replacement(range(rows + 1), groups - 1):
            bounds = (0, *cuts, rows)
            worst = max(worst, sum(-(-(hi - lo) // tn) for lo, hi in zip(bounds, bounds[1:])))
        assert worst <= max_token_tiles(rows, groups, tn)


def test_configs_refuse_what_cannot_work():
    with pytest.raises(ValueError, match="tile_m"):
        validate(VarlenConfig("x", tile_m=64))
    with pytest.raises(ValueError, match="accumulator"):
        validate(VarlenConfig("x", tile_m=256, tile_n=256))
    with pytest.raises(ValueError, match="ab_stages"):
        validate(VarlenConfig("x", ab_stages=1))


def _compile_call(cfg, n: int, fused: bool):
    """The NVFP4-activation call (one host function: prologue and GEMM, or the fused kernel) compiled offline for
    sm_90a at G = 8, K_pad = 1024 (the caller sets CUTE_DSL_ARCH)."""
    from nvfp4lib.kernels.common.compiling import compile_offline
    from nvfp4lib.kernels.hopper_varlen.kernel import kernel_classes
    from nvfp4lib.kernels.hopper_varlen.report import TVM_FFI, call_arguments

    _, gemm_cls, call_cls = kernel_classes()
    return compile_offline(call_cls(gemm_cls(cfg, 8, n, 1024), fused), *call_arguments(cfg, 8, n, 1024),
                           arch="sm_90a", ptxas=False, extra_options=TVM_FFI)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if c.act == "nvfp4"])  # bf16: tests/test_a16.py
def test_every_config_compiles_for_sm90a(name, monkeypatch):
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    r = compile_report(CONFIGS[name], groups=8, n=4096, k_pad=1024, ptxas=False)
    cfg = CONFIGS[name]
    variants = cfg.tile_n // cfg.step
    assert r["gemm"]["wgmma.mma_async"] == variants * (cfg.tile_k // 16) * cfg.blocks
    assert r["gemm"]["cp.async.bulk.tensor"] > 0 and r["gemm"]["mbarrier.try_wait"] > 0
    assert "griddepcontrol.wait" in r["ptx"] and "griddepcontrol.launch_dependents" in r["prologue_ptx"]
    assert "cvt.rn.f16x2.e4m3x2" in r["prologue_ptx"]
    # eager calls run every config's fused call (kernel.EAGER_FUSED): it compiles too, one kernel
    art = _compile_call(cfg, 4096, fused=True)
    assert art.ptx.count(".entry") == 1 and "kernel_fused" in art.ptx
    assert art.instructions["wgmma.mma_async"] == r["gemm"]["wgmma.mma_async"]


@pytest.mark.slow
def test_stage_wait_forms_in_the_ptx(monkeypatch):
    """VarlenConfig.wait: "spin" replaces the stage wait's hinted try_wait (suspend-time hint) by unhinted tries (one
    inline, one in the loop); "once" adds one unhinted try before the hinted wait, which stays."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    def tries(name):
        ptx = compile_report(CONFIGS[name], groups=2, n=3072, k_pad=1024, ptxas=False)["ptx"]
        lines = [ln for ln in ptx.splitlines() if "mbarrier.try_wait" in ln]
        hinted = sum(1 for ln in lines if re.search(r",\s*\d+;\s*$", ln))
        return hinted, len(lines) - hinted

    base = tries("vl_m128_t128_k128_s3_e")
    assert tries("vl_m128_t128_k128_s3_e_w") == (base[0] - 1, base[1] + 2)
    assert tries("vl_m128_t128_k128_s3_e_o") == (base[0], base[1] + 1)


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False])
def test_nvfp4_call_is_one_host_function(monkeypatch, fused):
    """What a runner launches for NVFP4 activations, from one TVM-FFI function (one host entry per call): by default
    the prologue kernel and the GEMM (programmatic dependent launch); with ``fused`` (FUSED_PROLOGUE) one kernel, the
    GEMM whose first CTAs decode the activations (tickets, a release per slice, an acquire spin before the activation
    loads, the last ticket's move to the next epoch). The GEMM's wgmma are those of the GEMM compiled alone."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    cfg = CONFIGS["vl_m128_t16_k128_s8_e"]
    art = _compile_call(cfg, 2048, fused)
    alone = compile_report(cfg, groups=8, n=2048, k_pad=1024, ptxas=False)
    assert art.instructions["wgmma.mma_async"] == alone["gemm"]["wgmma.mma_async"]
    if fused:
        assert art.ptx.count(".entry") == 1 and "kernel_fused" in art.ptx
        assert "ActivationDecodeSm90" not in art.ptx and "griddepcontrol" not in art.ptx
        for op in ("atom.relaxed.gpu.global.add.u32", "red.relaxed.gpu.global.add.u32",
                   "red.release.gpu.global.add.u32", "ld.acquire.gpu.global.u32", "fence.proxy.async.global"):
            assert op in art.ptx, op
    else:
        assert art.ptx.count(".entry") == 2
        assert "ActivationDecodeSm90" in art.ptx and "GroupedVarlenGemmSm90" in art.ptx
        assert "griddepcontrol.wait" in art.ptx and "griddepcontrol.launch_dependents" in art.ptx
        assert "ld.acquire.gpu" not in art.ptx


def _entries(ptx: str) -> dict:
    """A PTX module's kernels: {name fragment: its text}, split at each ``.entry``."""
    parts = ptx.split(".entry")[1:]
    return {("prologue" if "ActivationDecodeSm90" in p.split("(")[0] else "gemm"): p for p in parts}


@pytest.mark.slow
@pytest.mark.parametrize("chain,gemm", [(False, False), (True, False), (True, True)])
def test_chained_kernels_wait_then_let_the_next_launch(monkeypatch, chain, gemm):
    """pdl.CHAIN (kernels.common.pdl): the prologue, launched chained, waits for the kernel before it before it lets
    the GEMM launch; with pdl.CHAIN_GEMM too, the NVFP4-activation GEMM lets the next kernel launch (after its own
    wait), W4A16's never. Off, the prologue does not wait (it is launched after its predecessor ends) and the GEMM
    lets nothing launch early."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.common import pdl
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    monkeypatch.setattr(pdl, "CHAIN", chain)
    monkeypatch.setattr(pdl, "CHAIN_GEMM", gemm)
    ks = _entries(_compile_call(CONFIGS["vl_m128_t16_k128_s8_e"], 2048, False).ptx)
    pro, body = ks["prologue"], ks["gemm"]
    assert "griddepcontrol.launch_dependents" in pro and "griddepcontrol.wait" in body
    assert ("griddepcontrol.wait" in pro) == chain
    if chain:
        assert pro.index("griddepcontrol.wait") < pro.index("griddepcontrol.launch_dependents")
    if gemm:
        assert body.index("griddepcontrol.wait") < body.rindex("griddepcontrol.launch_dependents")
    assert ("griddepcontrol.launch_dependents" in body) == gemm
    # W4A16's GEMM lets the next kernel launch early only with pdl.CHAIN_GEMM_A16 too (the layer's down GEMM follows
    # its gate/up GEMM)
    for a16_too in (False, True):
        monkeypatch.setattr(pdl, "CHAIN_GEMM_A16", a16_too)
        a16 = compile_report(CONFIGS["vl_a16_m128_t16_k128_s8_e"], groups=8, n=2048, k_pad=1024, ptxas=False)["ptx"]
        assert ("griddepcontrol.launch_dependents" in a16) == (chain and gemm and a16_too)
        assert "griddepcontrol.wait" in a16


@pytest.mark.slow
def test_timeline_stamps_only_where_set(monkeypatch):
    """kernel.TIMELINE (a development timeline, off as shipped): a GEMM built with a buffer address stamps %clock64
    six times and %globaltimer twice per tile variant path into it, by thread 0; built without, no stamp at all."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.hopper_varlen import kernel
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    for name in ("vl_m128_t16_k128_s8_e", "vl_dual_m64_t16_k128_s8_e", "vl_a16_m128_t16_k128_s8_e"):  # one variant
        monkeypatch.setattr(kernel, "TIMELINE", 0)
        off = _entries(compile_report(CONFIGS[name], groups=8, n=2048, k_pad=1024, ptxas=False)["ptx"])["gemm"]
        assert "%clock64" not in off and "%globaltimer" not in off, name
        monkeypatch.setattr(kernel, "TIMELINE", 1 << 40)
        on = _entries(compile_report(CONFIGS[name], groups=8, n=2048, k_pad=1024, ptxas=False)["ptx"])["gemm"]
        assert on.count("mov.u64 t, %clock64") == 6 and on.count("mov.u64 t, %globaltimer") == 2, name
        assert on.count("st.global.u64") == 8, name


@pytest.mark.slow
def test_prewait_stages_ask_for_the_other_first_stages_after_the_wait(monkeypatch):
    """kernel.PREWAIT_STAGES (2 as shipped; 0: all the first stages' weights before the wait): set, a W4A16 decode
    tiling's GEMM has one more load site, the other first stages' weights and activations together after the wait (one
    weight copy and an activation copy per 64-K sub-block more in its PTX); a study tiling's GEMM and a W4A4 one are
    the same either way; a negative value is refused."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.hopper_varlen import kernel
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    for name in ("vl_a16_m128_t16_k128_s8_e_x", "vl_a16_dual_m64_t16_k128_s8_e"):
        copies = []
        for pre in (0, 2):
            monkeypatch.setattr(kernel, "PREWAIT_STAGES", pre)
            ptx = _entries(compile_report(CONFIGS[name], groups=8, n=2048, k_pad=1024, ptxas=False)["ptx"])["gemm"]
            copies.append(ptx.count("cp.async.bulk.tensor"))
        assert copies[1] == copies[0] + 1 + CONFIGS[name].tile_k // 64, (name, copies)
    for name in ("vl_m128_t128_k128_s3_e", "vl_m128_t16_k128_s8_e_x"):  # a study tiling; a W4A4 decode tiling
        ptx = []
        for pre in (0, 2):
            monkeypatch.setattr(kernel, "PREWAIT_STAGES", pre)
            ptx.append(compile_report(CONFIGS[name], groups=8, n=2048, k_pad=1024, ptxas=False)["ptx"])
        assert ptx[0] == ptx[1], name  # built as before
    monkeypatch.setattr(kernel, "PREWAIT_STAGES", -1)
    with pytest.raises(ValueError, match="PREWAIT_STAGES"):
        compile_report(CONFIGS["vl_m128_t16_k128_s8_e"], groups=8, n=2048, k_pad=1024, ptxas=False)


@pytest.mark.slow
def test_tile_search_walks_few_groups_and_shuffles_over_many(monkeypatch):
    """_schedule: up to LOOP_GROUPS groups each thread walks them (G + 1 loads, no shuffles: the PTX of the large-token
    tiles before the warp search, which ran them 6-11% slower); above, each lane loads ceil(G/32) group ends (plus
    offsets[0]) at once, then two scans over the lanes (6 up-shuffles each) and five broadcasts (5 butterfly steps
    each)."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    import re

    from nvfp4lib.kernels.hopper_varlen.kernel import LOOP_GROUPS
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    for groups in (8, 256):
        ptx = compile_report(CONFIGS["vl_m128_t16_k128_s8_e"], groups=groups, n=2048, k_pad=1024, ptxas=False)["ptx"]
        loads = len(re.findall(r"ld\.global\.u32", ptx))
        if groups <= LOOP_GROUPS:
            assert not re.findall(r"shfl\.sync\.(up|bfly)", ptx) and loads == groups + 1
        else:
            assert len(re.findall(r"shfl\.sync\.up", ptx)) == 12 and len(re.findall(r"shfl\.sync\.bfly", ptx)) == 25
            assert loads == -(-groups // 32) + 1


def test_packed_form_writes_a_given_output():
    w = prepare_weights(_weights(), backend="reference")
    ap = quantize(torch.randn(12, 128))
    off = torch.tensor([0, 4, 4, 12], dtype=torch.int32)
    out = torch.empty(12, 64, dtype=torch.float16)
    assert w(ap, off, out=out) is out and torch.equal(out, w(ap, off))
    with pytest.raises(ValueError, match="out must be"):
        w(ap, off, out=torch.empty(12, 64))
    with pytest.raises(TypeError, match="packed form"):
        w([ap, ap, ap], out=out)


def test_gather_plan_refuses_a_matrix_past_32_bit_offsets():
    """The one-shot gather's offsets inside one group's matrix are 32-bit: a matrix of 2^35 elements or more is
    refused by name, not wrapped around; one just under it is planned (no GPU, no Triton: the plan is host code)."""
    from nvfp4lib.kernels.hopper_varlen.gather import Plan

    with pytest.raises(ValueError, match="2\\^35"):
        Plan(1, 1 << 20, 1 << 15, 1 << 20, 1 << 15, 2, 1, False, 0)
    Plan(1, (1 << 19) - 128, 1 << 15, (1 << 19) - 128, 1 << 15, 2, 1, False, 0)


def test_one_shot_table_takes_only_operands_it_can_read_in_place():
    """The one-shot call's only pass over its operands (``group_table``) gives the rows in :data:`FIELDS` order for
    operands it can read in place, and None for anything else, which then takes the checked path and its error."""
    from nvfp4lib.kernels.hopper_varlen.gather import FIELDS, F, group_table

    torch.manual_seed(0)
    a = [quantize(torch.randn(m, 64)) for m in (3, 0)]
    b = [quantize(torch.randn(16, 64)) for _ in range(2)]
    b2 = [quantize(torch.randn(16, 64)) for _ in range(2)]
    t = group_table(a, b, b2)
    assert len(t) == 2 * F
    assert b[1].addresses() is b[1].addresses()  # read once per tensor, then kept
    row = dict(zip(FIELDS, t[F:2 * F]))
    assert row == {"a_codes": a[1].data.data_ptr(), "a_scales": a[1].scales.data_ptr(), "a_rows": 0,
                   "b_codes": b[1].data.data_ptr(), "b_scales": b[1].scales.data_ptr(),
                   "b2_codes": b2[1].data.data_ptr(), "b2_scales": b2[1].scales.data_ptr(),
                   "a_gs": a[1].global_scale.data_ptr(), "b_gs": b[1].global_scale.data_ptr(),
                   "b2_gs": b2[1].global_scale.data_ptr()}
    assert group_table(a, b)[2::F] == [3, 0]
    assert group_table(a, b)[5:7] == group_table(a, b)[3:5]  # one matrix: b2's columns repeat b's
    assert group_table(None, b)[:3] == [0, 0, 0]
    wide = torch.zeros(3, 40, dtype=torch.uint8)
    strided = NVFP4Tensor(wide[:, :32], a[0].scales, a[0].global_scale)
    k_off = [quantize(torch.randn(3, 32)), a[1]]
    refused = {"non-contiguous codes": ([strided, a[1]], b, None), "another K": (k_off, b, None),
               "another N": (a, [b[0], quantize(torch.randn(8, 64))], None), "b2 of another N":
               (a, b, [b2[0], quantize(torch.randn(8, 64))]), "fewer weights": (a, b[:1], None),
               "not NVFP4Tensors": ([x.data for x in a], b, None), "a tensor, not a list": (a[0], b, None),
               "no groups": ([], [], None)}
    for name, (x, w, w2) in refused.items():
        assert group_table(x, w, w2) is None, name
    with pytest.raises(ValueError, match="K mismatch"):  # the checked path names it
        nvfp4lib.grouped_gemm(k_off, b, backend="cute-hopper")


def test_check_grid_refuses_calls_past_the_ticket_field():
    """A call whose worst split needs more CTAs than the fused kernel's ticket field counts gets a clear error before
    any launch; the shapes of the study are far below it."""
    from nvfp4lib.kernels.hopper_varlen.config import MAX_FUSED_CTAS, check_grid

    cfg = CONFIGS["vl_m128_t16_k128_s8_e"]
    check_grid(cfg, 4096, 8, 7168)
    rows = (MAX_FUSED_CTAS // (7168 // cfg.tile_m) + 1) * cfg.tile_n
    with pytest.raises(ValueError, match="split the rows"):
        check_grid(cfg, rows, 8, 7168)


@pytest.mark.parametrize("slots,every", [(64, 16), (4, 1), (8, 4)])
def test_one_shot_table_ring_never_overwrites_a_table_in_use(slots, every):
    """Simulated in stream order: waiting on a block's event means every call up to the one that recorded it has run.
    A call may write a slot only once the slot's previous call has run; the driver calls are two per block."""
    from nvfp4lib.kernels.hopper_varlen.oneshot import _Ring

    ring = _Ring(slots, every)
    recorded_at: dict[int, int] = {}  # block -> the call whose event it holds
    ran_up_to, last_user, driver_calls = -1, {}, 0
    for call in range(10 * slots + 3):
        slot, wait = ring.take()
        if wait is not None:
            driver_calls += 1
            ran_up_to = max(ran_up_to, recorded_at.get(wait, -1))
        if slot in last_user:
            assert last_user[slot] <= ran_up_to, (call, slot)
        last_user[slot] = call
        block = ring.records()
        if block is not None:
            driver_calls += 1
            recorded_at[block] = call
    assert driver_calls <= 2 * -(-(10 * slots + 3) // every)
    with pytest.raises(ValueError, match="two blocks"):
        _Ring(16, 16)


def test_split_k_only_where_the_tiles_leave_sms_idle(monkeypatch):
    """choose_splits (the shipped rule, "pair"): a split_k config splits K over the SMs its grid leaves idle (one CTA
    per SM; two where each slice keeps PAIR_MIN_K_TILES K tiles), at most MAX_SPLITS slices of at least
    MIN_SPLIT_K_TILES K tiles, none empty; never for other configs or with the SPLIT_K knob off."""
    from nvfp4lib.kernels.hopper_varlen import config as vc

    dual, single = CONFIGS["vl_dual_m64_t16_k128_s8_e_x"], CONFIGS["vl_m128_t16_k128_s8_e_x"]
    assert vc.choose_splits(dual, 8, 128, 768, 2048, 132) == 1  # Qwen3-like T=1 gate/up: 96 CTAs
    assert vc.choose_splits(single, 8, 128, 2048, 768, 132) == 1  # its down GEMM: 128 CTAs
    assert vc.choose_splits(single, 2, 8, 4096, 14336, 132) == 4  # Mixtral-like T=1 down: 64 CTAs, 2 per SM
    assert vc.choose_splits(single, 2, 8, 1024, 4096, 132) == 8  # 16 CTAs, 32 K tiles: MAX_SPLITS
    assert vc.choose_splits(single, 2, 8, 1024, 1024, 132) == 2  # 8 K tiles: slices of MIN_SPLIT_K_TILES
    assert vc.choose_splits(single, 64, 128, 768, 2048, 132) == 1  # Qwen3-like T=8: 384 CTAs
    assert vc.choose_splits(single, 0, 8, 1024, 4096, 132) == 1  # no rows
    assert vc.choose_splits(single, 1, 1, 1024, 2304, 132) == 4  # 18 K tiles: slices of 5, 5, 5, 3
    assert vc.choose_splits(CONFIGS["vl_m128_t16_k128_s8_e"], 2, 8, 1024, 4096, 132) == 1
    monkeypatch.setattr(vc, "SPLIT_K", False)
    assert vc.choose_splits(single, 2, 8, 1024, 4096, 132) == 1
    assert {c.act for c in CONFIGS.values() if c.split_k} == {"nvfp4", "bf16"}
    assert all(n.removesuffix("_b2").endswith("_x") == c.split_k for n, c in CONFIGS.items())


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, c in CONFIGS.items() if c.split_k])
def test_split_k_configs_show_the_slice_count_in_their_ptx(name, monkeypatch):
    """A split_k config's GEMM (and, for NVFP4 activations, its fused call) counts each tile's CTAs at one acq_rel
    atomic, zeroes the count from the last CTA, and reads the other slices' fp32 sums at GPU scope; the same tiling
    without split_k has none of it."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    cfg = CONFIGS[name]
    ptx = compile_report(cfg, groups=8, n=2048, k_pad=1024, ptxas=False)["ptx"]
    assert ptx.count("atom.acq_rel.gpu.global.add.u32") == 1 and "st.relaxed.gpu.global.u32" in ptx
    assert "ld.relaxed.gpu.global.f32" in ptx and "fence.acq_rel.gpu" in ptx
    plain_cfg = cfg.with_(name=name.removesuffix("_x"), split_k=False)
    plain = compile_report(plain_cfg, groups=8, n=2048, k_pad=1024, ptxas=False)["ptx"]
    assert "atom.acq_rel.gpu" not in plain and "ld.relaxed.gpu.global.f32" not in plain
    if cfg.act == "nvfp4":
        assert _compile_call(cfg, 2048, fused=True).ptx.count("atom.acq_rel.gpu.global.add.u32") == 1


def test_split_rule_balance_minimises_the_busiest_sm():
    """The "balance" rule (a knob, not the default): the fewest slices that minimise ceil(CTAs·S / SMs) · ceil(K tiles
    / S); where the grid leaves SMs idle it splits as "idle" does, and it splits the Qwen3-like gate/up GEMM at T=1
    (96 CTAs) that "idle" leaves whole."""
    from nvfp4lib.kernels.hopper_varlen import config as vc

    dual, single = CONFIGS["vl_dual_m64_t16_k128_s8_e_x"], CONFIGS["vl_m128_t16_k128_s8_e_x"]
    assert vc.SPLIT_RULE == vc.SHIPPED_SPLIT_RULE == "pair"
    assert vc.choose_splits(dual, 8, 128, 768, 2048, 132, rule="balance") == 4  # 3 CTAs x 4 K tiles, not 1 x 16
    assert vc.choose_splits(dual, 8, 128, 768, 2048, 132, rule="idle") == 1
    assert vc.choose_splits(single, 8, 128, 2048, 768, 132, rule="balance") == 1  # 128 CTAs, 6 K tiles: a tie
    assert vc.choose_splits(single, 2, 8, 4096, 14336, 132, rule="balance") == 2  # Mixtral-like down, as "idle"
    assert vc.choose_splits(single, 64, 128, 768, 2048, 132, rule="balance") == 1  # a full grid: never split
    with pytest.raises(ValueError, match="split rule 'fast'"):
        vc.choose_splits(single, 2, 8, 4096, 14336, 132, rule="fast")


def test_split_rule_pair_takes_two_ctas_per_sm_only_for_long_slices():
    """The "pair" rule (shipped): two CTAs per SM where each slice keeps PAIR_MIN_K_TILES K tiles (the
    Mixtral-like down GEMM at T=1: 64 CTAs x 4 slices of 28 K tiles), else as "idle" (the Qwen3-like GEMMs at T=1)."""
    from nvfp4lib.kernels.hopper_varlen import config as vc

    dual, single = CONFIGS["vl_dual_m64_t16_k128_s8_e_x"], CONFIGS["vl_m128_t16_k128_s8_e_x"]
    assert vc.choose_splits(single, 2, 8, 4096, 14336, 132, rule="idle") == 2
    assert vc.choose_splits(single, 2, 8, 4096, 14336, 132, rule="pair") == 4
    assert vc.choose_splits(dual, 8, 128, 768, 2048, 132, rule="pair") == 1  # 96 CTAs, 16 K tiles: not 2 x 8
    assert vc.choose_splits(single, 8, 128, 2048, 768, 132, rule="pair") == 1
    assert vc.choose_splits(single, 2, 8, 4096, 2048, 132, rule="pair") == 2  # 16 K tiles: 2 idle-filling slices
    assert vc.choose_splits(single, 64, 128, 768, 2048, 132, rule="pair") == 1  # a full grid: never split


def test_split_setting_sets_the_knobs_for_a_block_only():
    """moe-bench's split-K A/B sets SPLIT_K and SPLIT_RULE per run (config.split_setting), then leaves them as
    they were."""
    from nvfp4lib.kernels.hopper_varlen import config as vc

    with vc.split_setting("balance"):
        assert (vc.SPLIT_K, vc.SPLIT_RULE) == (True, "balance")
        with vc.split_setting(False):
            assert not vc.SPLIT_K
        assert (vc.SPLIT_K, vc.SPLIT_RULE) == (True, "balance")
    with vc.split_setting(None):
        assert (vc.SPLIT_K, vc.SPLIT_RULE) == (True, vc.SHIPPED_SPLIT_RULE)
    with pytest.raises(ValueError, match="split_k 'fast'"), vc.split_setting("fast"):
        pass
    assert (vc.SPLIT_K, vc.SPLIT_RULE) == (True, vc.SHIPPED_SPLIT_RULE)


def test_choice_source_says_where_auto_took_its_config(tmp_path, monkeypatch):
    """config="auto" reports "rule" on a cache miss and "tuned" once the tuning cache holds the bucket; a named config
    reports "named" (bench and calls rows carry it, so a tuned run is never read as the shipped rule's)."""
    from nvfp4lib.serving import PreparedWeights, _CuteHopperImpl

    monkeypatch.setenv("NVFP4LIB_CACHE", str(tmp_path))
    tuning.forget_memory()
    key = tuning.problem_key("H200", "cute-hopper", False, torch.float16, 8, 7168, 2048, 128)
    fake = types.SimpleNamespace(fixed=None, weights=types.SimpleNamespace(groups=8), _key=lambda bucket: key)
    assert _CuteHopperImpl.choice_source(fake, 1024) == "rule"
    tuning.store(key, "vl_m128_t96_k128_s3_e_o")
    assert _CuteHopperImpl.choice_source(fake, 1024) == "tuned"
    fake.fixed = "vl_m128_t96_k128_s3_e_o"
    assert _CuteHopperImpl.choice_source(fake, 1024) == "named"
    tuning.forget_memory()
    plain = types.SimpleNamespace(impl=types.SimpleNamespace())  # (a backend without a choice: the reference)
    assert PreparedWeights.choice_source(plain, 8) == "named"
    assert tuning.rule_knobs() == {"once_wait": tuning.ONCE_WAIT, "short_k": tuning.SHORT_K,
                                   "dual_96": tuning.DUAL_96, "dual_96_k": tuning.DUAL_96_K,
                                   "decode_s5": tuning.DECODE_S5, "decode_s5_min_ctas": tuning.DECODE_S5_MIN_CTAS,
                                   "decode_t32_s4": tuning.DECODE_T32_S4,
                                   "decode_pair": "t32" if tuning.DECODE_PAIR else "off",
                                   "narrow_pair": f"k{tuning.NARROW_PAIR_MIN_K_TILES}" if tuning.NARROW_PAIR
                                   else "off"}


def test_three_cta_tiers_are_taken_only_for_grids_of_many_ctas_per_sm(monkeypatch):
    """tuning.DECODE_S5: at most 4 rows per group, the 16-token tiles with 5 stages where the 16-token grid has at
    least DECODE_S5_MIN_CTAS CTAs per SM (the DeepSeek-like T = 8 GEMMs), the 8-stage ones below (Mixtral-like and
    DeepSeek-like T = 1); off, never."""
    from nvfp4lib import tuning
    from nvfp4lib.serving import rule_choice

    assert tuning.DECODE_S5 and tuning.DECODE_S5_MIN_CTAS == 4  # (as shipped)
    monkeypatch.setattr(tuning, "NARROW_PAIR", False)  # (the narrow two-block tier: its own test)
    assert tuning.wide_grid(False, 64, 256, 7168, 132) and tuning.wide_grid(True, 64, 256, 2048, 132)  # 3584, 2048
    assert not tuning.wide_grid(True, 2, 8, 14336, 132) and not tuning.wide_grid(False, 8, 256, 7168, 132)  # 448
    assert rule_choice(False, 256, 7168, 2048, 64) == "vl_m128_t16_k128_s5_e_x"
    assert rule_choice(True, 256, 2048, 7168, 64, "bf16") == "vl_a16_dual_m64_t16_k128_s5_e_x"
    assert rule_choice(False, 256, 7168, 2048, 8) == "vl_m128_t16_k128_s8_e_x"
    assert rule_choice(False, 8, 4096, 14336, 4096) == rule_choice(False, 8, 4096, 14336, 4096, sms=1)  # big buckets
    assert tuning.DECODE_T32_S4 and tuning.DECODE_PAIR  # (as shipped: the two-block tier first from 5 rows)
    assert tuning.wide_grid(True, 128, 8, 14336, 132) and not tuning.wide_grid(False, 128, 8, 4096, 132)  # 2464, 352
    assert rule_choice(True, 8, 14336, 4096, 128) == "vl_dual_m128_t32_k128_s4_e_b2"
    assert rule_choice(True, 8, 14336, 4096, 128, "bf16") == "vl_a16_dual_m128_t32_k128_s4_e_b2"
    assert rule_choice(False, 8, 4096, 14336, 128) == "vl_m128_t32_k128_s6_e"
    assert rule_choice(False, 256, 7168, 2048, 64) == "vl_m128_t16_k128_s5_e_x"  # (up to 4 rows: not the pair tier)
    monkeypatch.setattr(tuning, "DECODE_PAIR", False)
    assert rule_choice(True, 8, 14336, 4096, 128) == "vl_dual_m64_t32_k128_s4_e"
    assert rule_choice(False, 256, 7168, 2048, 8) == "vl_m128_t16_k128_s8_e_x"  # (the 16-token tier: DECODE_S5's)
    monkeypatch.setattr(tuning, "DECODE_S5", False)
    assert rule_choice(False, 256, 7168, 2048, 64) == "vl_m128_t16_k128_s8_e_x"
    monkeypatch.setattr(tuning, "DECODE_T32_S4", False)
    assert rule_choice(True, 8, 14336, 4096, 128) == "vl_dual_m64_t32_k128_s6_e"


def test_narrow_two_block_tier_is_taken_where_its_grid_fills_the_sms_in_long_runs(monkeypatch):
    """tuning.NARROW_PAIR: at most 4 rows per group and not a wide grid, the 16-token two-block split-K tiles where
    their grid with its K slices has at least one CTA per SM and runs unsplit or in slices of at least
    NARROW_PAIR_MIN_K_TILES K tiles (Mixtral-like T = 1 gate/up and T = 8 down, DeepSeek-like T = 1 down); not the
    GEMMs whose slices would be short (Mixtral-like T = 1 down: 7 of 16, DeepSeek-like T = 1 gate/up: 2 of 28), nor
    the Qwen3-like ones (96 and 64 CTAs), nor wide calls (DECODE_S5's), nor more rows; off, never."""
    from nvfp4lib import tuning
    from nvfp4lib.serving import rule_choice

    assert tuning.NARROW_PAIR and tuning.NARROW_PAIR_MIN_K_TILES == 32  # (as shipped)
    # (dual, groups, N, K, rows): the GEMMs of the bench's layers at T = 1 (and Mixtral-like T = 8's down)
    taken = [(True, 8, 14336, 4096, 2), (False, 256, 7168, 2048, 8), (False, 8, 4096, 14336, 16)]
    short = [(False, 8, 4096, 14336, 2), (True, 256, 2048, 7168, 8)]
    qwen3 = [(True, 128, 768, 2048, 8), (False, 128, 2048, 768, 8)]
    for dual, *shape in taken:
        assert tuning.decode_grid(dual, shape[3], shape[0], shape[1], shape[2], 132) == "pair"
        assert rule_choice(dual, *shape) == tuning.NARROW_PAIR_TIER[1][dual]
        assert rule_choice(dual, *shape, "bf16") == tuning.NARROW_PAIR_TIER[1][dual].replace("vl_", "vl_a16_", 1)
    for dual, *shape in short + qwen3:
        assert tuning.decode_grid(dual, shape[3], shape[0], shape[1], shape[2], 132) != "pair"
        assert rule_choice(dual, *shape).endswith("_s8_e_x")
    monkeypatch.setattr(tuning, "NARROW_PAIR_MIN_K_TILES", 16)  # (the first A/B's rule: every slice length)
    assert all(tuning.decode_grid(d, s[3], s[0], s[1], s[2], 132) == "pair" for d, *s in short)
    assert rule_choice(False, 256, 7168, 2048, 64) == "vl_m128_t16_k128_s5_e_x"  # (wide: DECODE_S5's tier)
    assert rule_choice(False, 8, 4096, 14336, 64) == "vl_m128_t32_k128_s6_e"  # (8 rows per group: not its bucket)
    assert "vl_m256_t16_k128_s4_e_x_b2" in tuning.shipped()
    monkeypatch.setattr(tuning, "NARROW_PAIR", False)
    for dual, *shape in taken + short:
        assert tuning.decode_grid(dual, shape[3], shape[0], shape[1], shape[2], 132) != "pair"
        assert rule_choice(dual, *shape).endswith(("_s8_e_x", "_s5_e_x"))


def test_tuning_runs_once_per_bucket_whatever_the_grid(monkeypatch):
    """The serving impl caches its choice per (bucket, wide grid): a bucket already chosen, by the rule or by tuning,
    is not tuned again when T changes within it; a new bucket is."""
    from nvfp4lib.serving import _CuteHopperImpl

    tuned = []
    fake = types.SimpleNamespace(tune=True, fixed=None, _last=(-1, None), _choice={(1, ""): "rule's"},
                                 weights=types.SimpleNamespace(groups=8),
                                 _tune=lambda run, rows: tuned.append(rows),
                                 config_for=lambda rows: "cfg",
                                 runner=lambda name: types.SimpleNamespace(check_rows=lambda rows: None))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    _CuteHopperImpl._runner_for(fake, 8, run=lambda c: None)  # (bucket 1: chosen already)
    assert tuned == []
    _CuteHopperImpl._runner_for(fake, 64, run=lambda c: None)  # (bucket 8: new)
    assert tuned == [64]


@pytest.mark.slow
def test_every_named_barrier_is_met_by_waiting_threads_where_racecheck_asked(monkeypatch):
    """kernel.HANDOFF_WAIT (on as shipped): warp 0 waits at the tile handoff's barrier 4 with the other warps, so the
    plain GEMM has no non-waiting arrival (racecheck's reports came with it: the kernel's racecheck note); off, warp 0
    arrives there without waiting. The fused call reads its ticket after the ring's barrier of every thread: no
    barrier 3 (the slices' barrier 2 stays, warps 1.. alone)."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.hopper_varlen import kernel
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    cfg = CONFIGS["vl_m128_t16_k128_s8_e"]
    for wait in (True, False):
        monkeypatch.setattr(kernel, "HANDOFF_WAIT", wait)
        ptx = compile_report(cfg, groups=8, n=2048, k_pad=1024, ptxas=False)["ptx"]
        assert ptx.count("bar.arrive 4, 256") == (0 if wait else 1), wait
        assert ptx.count("bar.sync 4, 256") == 1, wait  # (waiting, every thread at one instruction)
    monkeypatch.setattr(kernel, "HANDOFF_WAIT", True)
    fused = _compile_call(cfg, 2048, True).ptx
    assert "bar.arrive" not in fused and "bar.sync 3" not in fused and "bar.sync 4, 256" in fused


@pytest.mark.slow
def test_the_slices_barrier_met_by_every_thread_with_slice_barrier_all(monkeypatch):
    """kernel.SLICE_BARRIER_ALL (on): the fused call's barrier 2 is met by every thread of the CTA (warp 0 too, as often
    as warps 1..), not by warps 1.. alone. (Warp 0 takes warps 1..'s path to it: an aligned barrier met at instructions
    of warp 0's own was synccheck's "divergent threads" and hung a call. NVVM duplicates the sites, so their count
    does not show that here; synccheck on the GPU does, docs/sanitizers.md.)"""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.hopper_varlen import kernel

    monkeypatch.setattr(kernel, "SLICE_BARRIER_ALL", True)
    fused = _compile_call(CONFIGS["vl_m128_t16_k128_s8_e"], 2048, True).ptx
    assert "bar.sync 2, 224" not in fused and "bar.sync 2, 256" in fused
    monkeypatch.setattr(kernel, "SLICE_BARRIER_ALL", False)
    fused = _compile_call(CONFIGS["vl_m128_t16_k128_s8_e"], 2048, True).ptx
    assert "bar.sync 2, 256" not in fused and "bar.sync 2, 224" in fused


@pytest.mark.slow
def test_the_ablations_remove_what_they_name(monkeypatch):
    """kernel.ABLATION (a diagnostic, off): "no_mma" leaves no wgmma and keeps the decode, "no_decode" keeps the wgmma
    and drops the decode's E4M3 conversions; anything else is refused when a GEMM is built."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4lib.kernels.hopper_varlen import kernel
    from nvfp4lib.kernels.hopper_varlen.report import compile_report

    cfg = CONFIGS["vl_m128_t16_k128_s8_e_x"]
    ptx = {}
    for ablation in kernel.ABLATIONS:
        monkeypatch.setattr(kernel, "ABLATION", ablation)
        ptx[ablation] = compile_report(cfg, groups=8, n=2048, k_pad=1024, ptxas=False)["ptx"]
    decode, mma = "cvt.rn.f16x2.e4m3x2", "wgmma.mma_async"
    assert decode in ptx[""] and mma in ptx[""]
    assert decode in ptx["no_mma"] and mma not in ptx["no_mma"]
    assert decode not in ptx["no_decode"] and mma in ptx["no_decode"]
    monkeypatch.setattr(kernel, "ABLATION", "no_x")
    with pytest.raises(ValueError, match="ABLATION"):
        compile_report(cfg, groups=8, n=2048, k_pad=1024, ptxas=False)
