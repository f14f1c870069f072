"""One-shot calls on a Hopper GPU (skipped without one): new weights every call through the one-launch gather, the
public functions and the study's harness (the group tuple and the dual tuple, every shape of the dual task), exact
against the reference; a non-contiguous operand or another layout of the harness's scales falls back to the checked
path and is still exact."""
import pytest
import torch

import nvfp4lib
from nvfp4lib import compat
from nvfp4lib.formats import NVFP4Tensor, quantize
from nvfp4lib.problems import BENCHMARK, DUAL, GroupedProblem, make_inputs, suite
from nvfp4lib.reference import reference_grouped_gemm, relative_error
from nvfp4lib.serving import oneshot

pytestmark = pytest.mark.gpu
TOL = 1e-3


@pytest.fixture(autouse=True)
def _sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")


def _poison(nbytes: int) -> None:
    junk = torch.full((nbytes // 2 + 1024,), float("nan"), dtype=torch.float16, device="cuda")
    del junk


@pytest.mark.parametrize("prob", BENCHMARK + DUAL, ids=lambda p: p.name)
@pytest.mark.parametrize("mode", ["uniform", "gaussian"])
def test_oneshot_functions_are_exact(prob, mode):
    inp = make_inputs(prob, seed=5, mode=mode, device="cuda")
    ref = reference_grouped_gemm(inp.a, inp.b, inp.b2)
    assert oneshot(inp.a, inp.b, inp.b2) is not None  # the fast path applies to these inputs
    _poison(sum(prob.m) * prob.n[0] * 2)
    if prob.dual:
        out = nvfp4lib.grouped_dual_gemm_silu(inp.a, inp.b, inp.b2, backend="cute-hopper")
    else:
        out = nvfp4lib.grouped_gemm(inp.a, inp.b, backend="cute-hopper")
    assert relative_error(out, ref) <= TOL


@pytest.mark.parametrize("m", [[0, 40, 0], [1, 0, 300], [0, 0, 0]])
def test_oneshot_empty_groups_and_ragged_k(m):
    prob = GroupedProblem("e", tuple(m), (264,) * 3, (2880,) * 3)
    inp = make_inputs(prob, seed=7, mode="gaussian", device="cuda")
    out = nvfp4lib.grouped_gemm(inp.a, inp.b, backend="cute-hopper")
    assert [tuple(o.shape) for o in out] == [(x, 264) for x in m]
    if sum(m):
        assert relative_error(out, reference_grouped_gemm(inp.a, inp.b)) <= TOL


def test_oneshot_fallback_for_non_contiguous_codes():
    inp = make_inputs(BENCHMARK[3], seed=3, mode="gaussian", device="cuda")
    a0 = inp.a[0]
    wide = torch.zeros((a0.data.shape[0], a0.data.shape[1] + 8), dtype=torch.uint8, device="cuda")
    wide[:, : a0.data.shape[1]] = a0.data
    a = [NVFP4Tensor(wide[:, : a0.data.shape[1]], a0.scales, a0.global_scale)] + inp.a[1:]
    assert oneshot(a, inp.b) is None
    out = nvfp4lib.grouped_gemm(a, inp.b, backend="cute-hopper")
    assert relative_error(out, reference_grouped_gemm(inp.a, inp.b)) <= TOL


def test_oneshot_new_weights_every_call():
    torch.manual_seed(0)
    a = [quantize(torch.randn(m, 512, device="cuda")) for m in (17, 64)]
    for _ in range(3):
        b = [quantize(torch.randn(256, 512, device="cuda") * 3) for _ in range(2)]
        out = nvfp4lib.grouped_gemm(a, b, backend="cute-hopper")
        assert relative_error(out, reference_grouped_gemm(a, b)) <= TOL


@pytest.mark.parametrize("prob", BENCHMARK, ids=lambda p: p.name)
def test_harness_reads_the_task_tensors_in_place(prob):
    inp = make_inputs(prob, seed=9, mode="uniform", device="cuda")
    data = compat.study_tuple(inp)
    assert compat._fast_group(data) is not None
    got = compat.custom_kernel(data)
    assert relative_error([c[..., 0] for c in got], reference_grouped_gemm(inp.a, inp.b)) <= TOL


def test_harness_with_copied_scales_takes_the_checked_path():
    inp = make_inputs(BENCHMARK[3], seed=9, mode="uniform", device="cuda")
    abc, plain, reord, sizes = compat.study_tuple(inp)
    reord = [(sa.clone(), sb.contiguous()) for sa, sb in reord]  # clone keeps strides; contiguous does not
    data = (abc, plain, reord, sizes)
    assert compat._fast_group(data) is None
    got = compat.custom_kernel(data)
    assert relative_error([c[..., 0] for c in got], reference_grouped_gemm(inp.a, inp.b)) <= TOL


# the dual task's shapes (problems.TASK), and beside them M and N not multiples of 128, N not of 64, K not of 128
_DUAL_SHAPES = suite("task-dual") + tuple(
    GroupedProblem(f"x{m}-{n}-{k}-dual", (m,), (n,), (k,), dual=True)
    for m, n, k in ((72, 96, 192), (1, 264, 2880), (200, 136, 7168), (1000, 4104, 512)))


def _no_prepare(monkeypatch):
    from nvfp4lib import serving

    def refuse(*args, **kwargs):
        raise AssertionError("the harness's fast path prepared weights")

    monkeypatch.setattr(serving, "prepare_weights", refuse)


@pytest.mark.parametrize("prob", _DUAL_SHAPES, ids=lambda p: p.name)
def test_dual_harness_reads_the_task_tensors_in_place(prob, monkeypatch):
    inp = make_inputs(prob, seed=9, mode="uniform", device="cuda")
    data = compat.study_tuple(inp)  # (the weights' global scale 2^-8 folded into their block scales: exact)
    assert compat._fast_dual(data) is not None
    _no_prepare(monkeypatch)
    got = compat.custom_kernel_dual(data)  # c starts NaN: an unwritten element fails the check
    assert got is data[9]
    assert relative_error([got[..., 0]], reference_grouped_gemm(inp.a, inp.b, inp.b2)) <= TOL


def test_dual_harness_with_copied_scales_takes_the_checked_path():
    inp = make_inputs(suite("task-dual")[5], seed=9, mode="uniform", device="cuda")
    data = compat.study_tuple(inp)
    data = data[:6] + tuple(t.contiguous() for t in data[6:9]) + data[9:]  # other strides, same values
    assert compat._fast_dual(data) is None
    got = compat.custom_kernel_dual(data)
    assert relative_error([got[..., 0]], reference_grouped_gemm(inp.a, inp.b, inp.b2)) <= TOL


@pytest.mark.parametrize("prob", suite("task")[1::2], ids=lambda p: p.name)
def test_dual_tuple_per_call_against_the_group_tuple(prob, monkeypatch):
    """Time per call (:func:`nvfp4lib.bench.calls.time_both`, L2 flushed) of the dual tuple's fast path, the group
    tuple at the same size and the dual tuple's checked path (weights prepared every call), printed (run with -s);
    the fast path must beat the checked one. The recorded comparison: ``calls --suite task``."""
    from nvfp4lib.bench.calls import time_both
    from nvfp4lib.timing import L2Flusher

    dual = compat.study_tuple(make_inputs(prob, seed=3, mode="uniform", device="cuda"))
    group = compat.study_tuple(make_inputs(prob.with_dual(False), seed=3, mode="uniform", device="cuda"))
    flush = L2Flusher()
    fast = time_both(lambda i: compat.custom_kernel_dual(dual), 20, flush)
    single = time_both(lambda i: compat.custom_kernel(group), 20, flush)
    monkeypatch.setattr(compat, "_fast_dual", lambda data: None)
    checked = time_both(lambda i: compat.custom_kernel_dual(dual), 5, flush)
    ratio = fast["per_call_us"] / single["per_call_us"]
    print(f"\n{prob.name}: dual tuple {fast['per_call_us']:.1f} us per call (b2b {fast['b2b_us']:.1f}), group tuple "
          f"{single['per_call_us']:.1f} (b2b {single['b2b_us']:.1f}): x{ratio:.2f}; dual tuple with the weights "
          f"prepared per call {checked['per_call_us']:.1f} ({torch.cuda.get_device_name()})")
    assert fast["per_call_us"] < checked["per_call_us"]


def test_oneshot_from_a_new_thread():
    """A one-shot call whose thread did no CUDA work before (its driver calls need the context current there)."""
    import threading

    inp = make_inputs(BENCHMARK[3], seed=9, mode="gaussian", device="cuda")
    nvfp4lib.grouped_gemm(inp.a, inp.b, backend="cute-hopper")  # compiled and bound on this thread
    torch.cuda.synchronize()
    got = []
    t = threading.Thread(target=lambda: got.append(nvfp4lib.grouped_gemm(inp.a, inp.b, backend="cute-hopper")))
    t.start()
    t.join()
    torch.cuda.synchronize()
    assert relative_error(got[0], reference_grouped_gemm(inp.a, inp.b)) <= TOL


def test_oneshot_on_two_streams_keeps_each_streams_scratch():
    """Calls on two streams at once (each stream its own packed weights, rows, fp16 scratch and tables): both exact.
    A scratch shared between the streams would let one call's prologue overwrite the other's rows mid-GEMM."""
    prob = BENCHMARK[2]
    sets = [make_inputs(prob, seed=20 + s, mode="gaussian", device="cuda") for s in range(2)]
    refs = [reference_grouped_gemm(x.a, x.b) for x in sets]
    streams = [torch.cuda.Stream() for _ in sets]
    nvfp4lib.grouped_gemm(sets[0].a, sets[0].b, backend="cute-hopper")  # compiled before the race
    torch.cuda.synchronize()
    outs = [[], []]
    for _ in range(4):
        for i, (x, s) in enumerate(zip(sets, streams)):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                outs[i].append(nvfp4lib.grouped_gemm(x.a, x.b, backend="cute-hopper"))
    torch.cuda.synchronize()
    for i in range(2):
        for out in outs[i]:
            assert relative_error(out, refs[i]) <= TOL
