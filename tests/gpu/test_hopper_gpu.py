"""cute-hopper on a Hopper GPU: exact against the reference on every suite (skipped without a GPU)."""
import pytest
import torch

from nvfp4lib.api import prepare
from nvfp4lib.bench import check_runner
from nvfp4lib.kernels.hopper import CONFIGS
from nvfp4lib.problems import BENCHMARK, CORRECTNESS, DUAL, EDGE, make_inputs
from nvfp4lib.reference import reference_grouped_gemm

pytestmark = pytest.mark.gpu

SINGLE = [n for n, c in CONFIGS.items() if not c.dual]
DUALS = [n for n, c in CONFIGS.items() if c.dual]
PROBLEMS = CORRECTNESS + EDGE + BENCHMARK


def _check(prob, config, mode, seed):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    inp = make_inputs(prob, seed=seed, mode=mode, device="cuda")
    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
    err = check_runner(prepare(inp.a, inp.b, inp.b2, backend="cute-hopper", config=config), ref)
    assert err <= 1e-3, f"{config} {prob.name} {mode}: rel_err {err}"


@pytest.mark.parametrize("config", SINGLE)
@pytest.mark.parametrize("prob", PROBLEMS, ids=[p.name for p in PROBLEMS])
@pytest.mark.parametrize("mode", ["uniform", "gaussian"])
def test_single(config, prob, mode):
    _check(prob, config, mode, seed=1111)


@pytest.mark.parametrize("config", DUALS)
@pytest.mark.parametrize("prob", [p.with_dual() for p in CORRECTNESS + EDGE] + list(DUAL),
                         ids=[p.name + "-dual" for p in CORRECTNESS + EDGE] + [p.name for p in DUAL])
@pytest.mark.parametrize("mode", ["uniform", "gaussian"])
def test_dual(config, prob, mode):
    _check(prob, config, mode, seed=1111)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_seeds(seed):
    _check(BENCHMARK[3], "baseline", "gaussian", seed)


def test_nan_scales_are_refused():
    inp = make_inputs(CORRECTNESS[0], seed=1, device="cuda")
    inp.b[0].scales.view(torch.uint8)[0, 0] = 0x7F
    with pytest.raises(ValueError, match="NaN"):
        prepare(inp.a, inp.b, None, backend="cute-hopper")
