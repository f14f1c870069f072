"""The bench's ``cute-hopper`` is the call users make (prepared weights, device offsets), eager and graph-replayed,
exact on the study's shapes; the study's kernels are reachable only as named configs."""
import pytest
import torch

from nvfp4lib.bench.backends import prepare
from nvfp4lib.bench.harness import check_runner
from nvfp4lib.problems import BENCHMARK, DUAL, get_problem, make_inputs
from nvfp4lib.reference import reference_grouped_gemm
from nvfp4lib.tuning import rule_knobs

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("prob", BENCHMARK + DUAL, ids=lambda p: p.name)
def test_default_cute_hopper_is_the_prepared_weights_call(prob, graph):
    x = make_inputs(prob, seed=7, mode="gaussian", device="cuda")
    r = prepare(x.a, x.b, x.b2, backend="cute-hopper", graph=graph)
    assert r.info["serving"] and r.info["config"].startswith("vl_")
    # rows say where auto took its config and under which shape rule (serving_report.rule_as_shipped reads them)
    assert r.info["choice"] in ("rule", "tuned") and {k: r.info[k] for k in rule_knobs()} == rule_knobs()
    assert check_runner(r, reference_grouped_gemm(x.a, x.b, x.b2)) <= 1e-3
    assert check_runner(r, reference_grouped_gemm(x.a, x.b, x.b2)) <= 1e-3  # a second call, outputs poisoned again
    if not graph:
        named = prepare(x.a, x.b, x.b2, backend="cute-hopper", config=r.info["config"])
        assert named.info["choice"] == "named"


def test_study_kernel_is_a_named_config():
    x = make_inputs(get_problem("S4"), seed=7, mode="gaussian", device="cuda")
    r = prepare(x.a, x.b, x.b2, backend="cute-hopper", config="rs_m128_t128_k128_s3_e")
    assert not r.info.get("serving")
    assert check_runner(r, reference_grouped_gemm(x.a, x.b, x.b2)) <= 1e-3
