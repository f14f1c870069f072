import pytest
import torch

from nvfp4lib import BENCHMARK, CORRECTNESS, DUAL, GroupedProblem, dequantize, get_problem, make_inputs
from nvfp4lib.problems import EDGE, SUITES, suite


def test_benchmark_suite_matches_the_brief():
    s1, s2, s3, s4 = BENCHMARK
    assert s1.m == (80, 176, 128, 72, 64, 248, 96, 160) and set(s1.n) == {4096} and set(s1.k) == {7168}
    assert s2.m == (40, 76, 168, 72, 164, 148, 196, 160) and set(s2.n) == {7168} and set(s2.k) == {2048}
    assert s3.m == (192, 320) and set(s3.n) == {3072} and set(s3.k) == {4096}
    assert s4.m == (128, 384) and set(s4.n) == {4096} and set(s4.k) == {1536}
    assert [p.b200_baseline_us for p in BENCHMARK] == [373, 372, 173, 156]
    assert all(d.dual and d.name == p.name + "-dual" and d.m == p.m for p, d in zip(BENCHMARK, DUAL))


def test_correctness_suite_matches_the_brief():
    assert len(CORRECTNESS) == 10
    c2 = get_problem("C2")
    assert c2.m == (256, 72) and c2.n == (512, 384) and c2.k == (256, 256)
    c10 = get_problem("C10")
    assert c10.groups == 4 and c10.k == (512, 128, 512, 128)


def test_flops_and_bytes():
    p = GroupedProblem("x", (2, 0), (8, 8), (32, 32))
    assert p.flops() == 2 * 2 * 8 * 32
    assert p.with_dual().flops() == 2 * p.flops()
    # A: 2 rows * (16 + 2) bytes; B: 2 groups * 8 rows * 18 bytes; C: 2*8 fp16
    assert p.nvfp4_bytes() == 2 * 18 + 2 * 8 * 18 + 2 * 2 * 8


def test_s1_floor_is_compute_bound_at_measured_ceilings():
    from nvfp4lib.bench.roofline import floor_us
    f = floor_us(BENCHMARK[0], {"bf16_tflops": 779.0, "copy_gbps": 3000.0})
    assert 76 < f < 78  # the brief: S1 floor 77 us


@pytest.mark.parametrize("bad", [
    dict(m=(16,), n=(8,), k=(24,)),        # K not a multiple of 16
    dict(m=(-1,), n=(8,), k=(32,)),        # negative M
    dict(m=(4,), n=(0,), k=(32,)),         # N = 0
    dict(m=(4, 4), n=(8,), k=(32,)),       # ragged spec
    dict(m=(), n=(), k=()),                # no groups
])
def test_bad_problems_are_refused(bad):
    with pytest.raises(ValueError):
        GroupedProblem("bad", **bad)


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown problem"):
        get_problem("S9")
    with pytest.raises(ValueError, match="unknown suite"):
        suite("nope")


@pytest.mark.parametrize("mode", ["uniform", "gaussian"])
def test_inputs_are_seeded_and_shaped(mode):
    p = get_problem("E1-empty-group").with_dual()
    x = make_inputs(p, seed=5, mode=mode)
    y = make_inputs(p, seed=5, mode=mode)
    z = make_inputs(p, seed=6, mode=mode)
    for g in range(p.groups):
        assert x.a[g].shape == (p.m[g], p.k[g]) and x.b[g].shape == (p.n[g], p.k[g])
        assert torch.equal(x.b2[g].data, y.b2[g].data)
    assert not torch.equal(x.b[1].data, z.b[1].data)


def test_uniform_mode_is_the_studys():
    x = make_inputs(get_problem("C1"), seed=1111, mode="uniform")
    s = torch.cat([t.scales.float().flatten() for t in x.a + x.b])
    assert set(s.unique().tolist()) == {1.0, 2.0}
    assert all(float(t.global_scale) == 1.0 for t in x.a + x.b)
    d = make_inputs(get_problem("C1").with_dual(), seed=1111, mode="uniform")
    assert all(float(t.global_scale) == 2.0**-8 for t in d.b + d.b2)
    codes = torch.cat([t.data.flatten() for t in x.a])
    assert codes.unique().numel() == 256  # every byte value occurs


def test_gaussian_mode_is_quantized_real_data():
    x = make_inputs(get_problem("C1"), seed=3, mode="gaussian")
    a = dequantize(x.a[0])
    assert 0.8 < float(a.std()) < 1.2


def test_suites_are_named():
    assert set(SUITES) >= {"benchmark", "dual", "correctness", "correctness-dual", "edge"}
    assert any(0 in p.m for p in EDGE)


def test_uniform_dual_outputs_stay_finite_in_fp16():
    from nvfp4lib import grouped_dual_gemm_silu
    p = GroupedProblem.uniform_nk("big-k", (64,), 256, 7168, dual=True)
    x = make_inputs(p, seed=1, mode="uniform")
    out = grouped_dual_gemm_silu(x.a, x.b, x.b2)
    assert torch.isfinite(out[0]).all()


def test_heavy_mode_has_outliers_per_row():
    """mode="heavy": a few entries per row far out in the tail (issue 20's third input distribution)."""
    from nvfp4lib.formats import dequantize
    from nvfp4lib.problems import HEAVY_OUTLIERS, GroupedProblem, make_inputs

    x = make_inputs(GroupedProblem.uniform_nk("h", (8,), 64, 256), seed=4, mode="heavy")
    a = dequantize(x.a[0]).abs()
    big = (a > 20 * a.median(dim=1, keepdim=True).values).sum(dim=1)
    assert bool((big >= 1).all()) and bool((big <= HEAVY_OUTLIERS).all())
    assert make_inputs(GroupedProblem.uniform_nk("h", (8,), 64, 256), seed=4, mode="heavy").a[0].data.equal(
        x.a[0].data)


def test_task_suites_are_the_dual_tasks_shapes():
    from nvfp4lib.problems import TASK

    assert [(p.m, p.n, p.k) for p in TASK[:4]] == [((256,), (4096,), (7168,)), ((512,), (4096,), (7168,)),
                                                  ((256,), (3072,), (4096,)), ((512,), (3072,), (7168,))]
    assert [p.name for p in suite("task")] == ["T1", "T1-dual", "T2", "T2-dual", "T3", "T3-dual", "T4", "T4-dual"]
    duals = suite("task-dual")
    assert len(duals) == len(TASK) == 13 and all(p.dual and p.groups == 1 for p in duals)
    assert all(p.m[0] % 128 == 0 and p.n[0] % 128 == 0 and p.k[0] % 256 == 0 for p in duals)  # as the task keeps them
