"""The torch peers against the exact reference (CPU here; tests/gpu covers CUDA)."""
import pytest
import torch

from nvfp4lib import get_problem, make_inputs
from nvfp4lib.api import prepare
from nvfp4lib.bench import check_runner
from nvfp4lib.formats import dequantize
from nvfp4lib.peers.torch_peers import E2M1_LUT, dequant16, probe_scaled_mm_fp4
from nvfp4lib.reference import reference_grouped_gemm


def test_dequant16_is_exact():
    x = make_inputs(get_problem("C1"), seed=4, mode="gaussian").b[0]
    d = dequant16(x.data, x.scales, torch.bfloat16).float()
    assert torch.equal(d * x.global_scale, dequantize(x))
    assert E2M1_LUT.numel() == 16


@pytest.mark.parametrize("backend", ["torch-bf16", "torch-dequant"])
@pytest.mark.parametrize("name", ["C4", "C9", "E1-empty-group"])
@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("mode", ["uniform", "gaussian"])
def test_torch_peers_match_the_reference(backend, name, dual, mode):
    p = get_problem(name).with_dual(dual)
    x = make_inputs(p, seed=5, mode=mode)
    ref = reference_grouped_gemm(x.a, x.b, x.b2)
    assert check_runner(prepare(x.a, x.b, x.b2, backend=backend), ref) <= 1e-3


@pytest.mark.parametrize("strategy", ["loop", "streams"])
def test_launch_strategies_on_cpu(strategy):
    x = make_inputs(get_problem("E1-empty-group"), seed=1)
    ref = reference_grouped_gemm(x.a, x.b)
    r = prepare(x.a, x.b, backend="torch-bf16", strategy=strategy)
    assert check_runner(r, ref) <= 1e-3
    assert r.outputs[0].shape == (0, 256)


def test_bad_strategy_and_graph_without_cuda():
    x = make_inputs(get_problem("C1"), seed=1)
    with pytest.raises(ValueError, match="unknown strategy"):
        prepare(x.a, x.b, backend="torch-bf16", strategy="threads")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA graphs"):
            prepare(x.a, x.b, backend="torch-bf16", graph=True)


@pytest.mark.slow
def test_torch_compile_matches_the_reference():
    p = get_problem("C4").with_dual()
    x = make_inputs(p, seed=6, mode="gaussian")
    ref = reference_grouped_gemm(x.a, x.b, x.b2)
    assert check_runner(prepare(x.a, x.b, x.b2, backend="torch-compile"), ref) <= 1e-3


@pytest.mark.parametrize("dual", [False, True])
def test_bf16_predequant_peer_matches_the_reference_at_its_bf16_tolerance(dual):
    """Both operands dequantized once at prepare; torch._grouped_mm per call (bf16 result: 4e-3)."""
    from nvfp4lib.problems import GroupedProblem

    x = make_inputs(GroupedProblem.uniform_nk("small", (3, 9), 64, 128, dual=dual), seed=2, mode="gaussian")
    ref = reference_grouped_gemm(x.a, x.b, x.b2)
    runner = prepare(x.a, x.b, x.b2, backend="torch-bf16-predequant")
    assert "activations dequantized once" in runner.notes
    assert check_runner(runner, ref) <= runner.tolerance


def test_grouped_mm_refuses_ragged_k():
    x = make_inputs(get_problem("C1"), seed=1)
    with pytest.raises((ValueError, RuntimeError)):
        prepare(x.a, x.b, backend="torch-grouped-mm")


def test_scaled_mm_probe_reports():
    info = probe_scaled_mm_fp4()
    assert set(info) >= {"supported", "error", "torch"}
    if not torch.cuda.is_available():
        assert info["supported"] is False and info["error"]


def test_graphed_runner_keeps_what_the_graph_reads_alive():
    # A CUDA graph replays raw addresses: the un-graphed runner (its weights, buffers) must outlive it.
    import gc
    import weakref

    from nvfp4lib.backends import Runner
    from nvfp4lib.launch import per_group

    x = make_inputs(get_problem("C1"), seed=1)
    r = per_group(lambda a, b, b2, **k: prepare(a, b, b2, backend="torch-bf16"), x.a, x.b, None,
                  out_dtype=torch.float16, streams=False)
    assert isinstance(r, Runner) and r.keepalive
    ref = weakref.ref(r.keepalive[0])
    gc.collect()
    assert ref() is not None


def test_triton_refuses_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    x = make_inputs(get_problem("C1"), seed=1)
    with pytest.raises(RuntimeError, match="CUDA"):
        prepare(x.a, x.b, backend="triton")
