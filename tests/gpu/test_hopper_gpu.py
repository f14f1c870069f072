"""cute-hopper on a Hopper GPU: exact against the reference on every suite (skipped without a GPU).

Every config ``auto`` can choose × a covering set of problems (uneven groups, an empty group, ragged M and K,
K = 2880, benchmark shapes; single or dual) on gaussian inputs, the study's other named configs on the empty-group and
ragged problems; with ``NVFP4LIB_GPU_FULL=1`` every config × every problem of
the correctness, edge and benchmark suites × (uniform, gaussian) — about an hour of compiling."""
import os

import pytest
import torch

from nvfp4lib.bench.backends import prepare
from nvfp4lib.bench.harness import check_runner
from nvfp4lib.kernels.hopper_smem.kernel import CONFIGS
from nvfp4lib.problems import BENCHMARK, CORRECTNESS, EDGE, make_inputs
from nvfp4lib.reference import reference_grouped_gemm

pytestmark = pytest.mark.gpu

TOL = 1e-3
SINGLE = [n for n, c in CONFIGS.items() if not c.dual]
DUALS = [n for n, c in CONFIGS.items() if c.dual]
FULL = os.environ.get("NVFP4LIB_GPU_FULL") == "1"
COVER = {"C4", "C9", "E1-empty-group", "E3-ragged", "E4-2880", "S2", "S4"}
MODES = ["uniform", "gaussian"] if FULL else ["gaussian"]
PROBLEMS = [p for p in CORRECTNESS + EDGE + BENCHMARK if FULL or p.name in COVER]
DUAL_PROBLEMS = [p.with_dual() for p in CORRECTNESS + EDGE + BENCHMARK if FULL or p.name in COVER]


def _needs_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")


def _check(prob, config, mode, seed):
    _needs_sm90()
    inp = make_inputs(prob, seed=seed, mode=mode, device="cuda")
    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
    runner = prepare(inp.a, inp.b, inp.b2, backend="cute-hopper", config=config)
    assert [tuple(o.shape) for o in runner.outputs] == [tuple(r.shape) for r in ref]
    err = check_runner(runner, ref)  # outputs poisoned with NaN first: unwritten elements fail
    assert err <= TOL, f"{config} {prob.name} {mode}: rel_err {err}"
    return runner, ref


def _cases(configs, problems):
    """(config, problem) pairs, each config's tests in one xdist group: one process compiles it once. The configs
    ``auto`` can choose get every problem; the study's other named configs (baselines and steps it narrates) an
    empty group and ragged M and K (compiling is most of the suite's time; ``NVFP4LIB_GPU_FULL=1`` gives them all)."""
    from nvfp4lib.bench.backends import AUTO_CANDIDATES

    served = set(AUTO_CANDIDATES[False]) | set(AUTO_CANDIDATES[True])
    return [pytest.param(c, p, marks=pytest.mark.xdist_group(c), id=f"{c}-{p.name}") for c in configs for p in problems
            if FULL or c in served or p.name.startswith(("E1-empty-group", "E3-ragged"))]


@pytest.mark.parametrize("config,prob", _cases(SINGLE, PROBLEMS))
@pytest.mark.parametrize("mode", MODES)
def test_single(config, prob, mode):
    _check(prob, config, mode, seed=1111)


@pytest.mark.parametrize("config,prob", _cases(DUALS, DUAL_PROBLEMS))
@pytest.mark.parametrize("mode", MODES)
def test_dual(config, prob, mode):
    _check(prob, config, mode, seed=1111)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("config", ["baseline", "producer_consumer"])
def test_seeds(seed, config):
    _check(BENCHMARK[3], config, "gaussian", seed)


def test_runner_is_exact_on_every_call():
    """The packed buffers persist between calls: a second call (poisoned again) is still exact."""
    runner, ref = _check(EDGE[2], "baseline", "uniform", 5)
    assert check_runner(runner, ref) <= TOL


def test_empty_group_gets_an_empty_output():
    runner, _ = _check(EDGE[0], "baseline", "uniform", 7)
    assert tuple(runner.outputs[0].shape) == (0, 256) and tuple(runner.outputs[2].shape) == (0, 256)


def test_nan_scales_are_refused():
    """The prepared weights (cute-hopper's default, the serving kernel) read their scales back once and refuse a NaN.
    (C1's groups differ in N and K, which that path refuses first: E3's share them.)"""
    _needs_sm90()
    inp = make_inputs(EDGE[2], seed=1, device="cuda")
    inp.b[0].scales.view(torch.uint8)[0, 0] = 0x7F
    with pytest.raises(ValueError, match="NaN"):
        prepare(inp.a, inp.b, None, backend="cute-hopper")


@pytest.mark.parametrize("config", ["rs_m128_t128_k128_s4", "rs_m128_t256_k128_s3_v32_e", "rs_dual_m64_t96_k128_s3_e",
                                    "baseline"])
def test_subnormal_scales_are_exact(config):
    """E4M3 subnormal scales (m·2^-9) on both operands: the smallest products the decode must keep exact."""
    _needs_sm90()
    dual = "dual" in config
    prob = CORRECTNESS[3].with_dual() if dual else CORRECTNESS[3]
    inp = make_inputs(prob, seed=9, mode="uniform", device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(9)
    for t in inp.a + inp.b + (inp.b2 or []):
        s = t.scales.view(torch.uint8)
        s.copy_(torch.randint(1, 8, s.shape, dtype=torch.uint8, device="cuda", generator=gen))
    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
    runner = prepare(inp.a, inp.b, inp.b2, backend="cute-hopper", config=config)
    assert check_runner(runner, ref) <= TOL


@pytest.mark.long_gpu
@pytest.mark.parametrize("dual", [False, True])
def test_study_auto_is_the_fastest_candidate_and_exact(dual):
    from nvfp4lib.bench.backends import AUTO_CANDIDATES

    _needs_sm90()
    prob = BENCHMARK[3].with_dual() if dual else BENCHMARK[3]
    inp = make_inputs(prob, seed=4, mode="gaussian", device="cuda")
    runner = prepare(inp.a, inp.b, inp.b2, backend="cute-hopper", config="study-auto")
    times = runner.info["auto"]
    assert set(times) == set(AUTO_CANDIDATES[dual]) and runner.info["config"] == min(times, key=times.get)
    assert check_runner(runner, reference_grouped_gemm(inp.a, inp.b, inp.b2)) <= TOL
