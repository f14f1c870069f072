"""Every peer backend against the exact reference on a CUDA GPU (skipped without one)."""
import pytest

from nvfp4lib.api import prepare
from nvfp4lib.bench import check_runner
from nvfp4lib.problems import BENCHMARK, CORRECTNESS, EDGE, make_inputs
from nvfp4lib.reference import reference_grouped_gemm

pytestmark = pytest.mark.gpu

PEERS = [("torch-bf16", {}), ("torch-bf16", {"graph": True}), ("torch-bf16", {"strategy": "streams"}),
         ("torch-dequant", {}), ("triton", {})]
PROBLEMS = CORRECTNESS + EDGE + BENCHMARK


@pytest.mark.parametrize("backend, opts", PEERS, ids=[f"{b}-{o}" for b, o in PEERS])
@pytest.mark.parametrize("prob", PROBLEMS, ids=[p.name for p in PROBLEMS])
@pytest.mark.parametrize("dual", [False, True])
def test_peer_is_exact(backend, opts, prob, dual):
    p = prob.with_dual(dual)
    x = make_inputs(p, seed=1111, mode="gaussian", device="cuda")
    ref = reference_grouped_gemm(x.a, x.b, x.b2)
    r = prepare(x.a, x.b, x.b2, backend=backend, **opts)
    assert check_runner(r, ref) <= (r.tolerance or 1e-3)


@pytest.mark.parametrize("prob", BENCHMARK, ids=[p.name for p in BENCHMARK])
def test_grouped_mm_within_its_stated_tolerance(prob):
    x = make_inputs(prob, seed=1111, mode="uniform", device="cuda")
    ref = reference_grouped_gemm(x.a, x.b)
    r = prepare(x.a, x.b, backend="torch-grouped-mm")
    assert r.tolerance and check_runner(r, ref) <= r.tolerance
