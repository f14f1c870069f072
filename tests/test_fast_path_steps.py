"""nvfp4lib.study.fast_path_steps: notebook 09's step table computed from data/ rows (no GPU)."""
import math

from nvfp4lib.study import fast_path_steps as fps
from nvfp4lib.study.experiment import FAST_PATH


def _bench(run_id, commit, problem, us, *, label="cute-hopper[graph=True]", family="hopper_rs", gpu="H100", **kw):
    return {"run_id": run_id, "git_commit": commit + "0" * 33, "problem": problem, "median_us": us,
            "ratio_to_floor": us / 10, "floor_us": 10.0, "label": label, "kernel_family": family, "gpu": gpu,
            "status": "ok", "flops": 1e9, "ceil_bf16_tflops": 750.0, **kw}


def _hist(round_, kind, problem, log="wip/rs/gpu_logs/x.log", commit="abcdef1", **kw):
    return {"round": round_, "kind": kind, "problem": problem, "source_log": log, "git_commit": commit + "0" * 33,
            "gpu": None, "config": kw.pop("config", "cfg"), **kw}


def test_fmt_median_and_range():
    assert fps.fmt([3.0, 1.0, 2.0]) == "2.0 (1.0-3.0)"
    assert fps.fmt([1.04, 1.01], 1) == "1.0"  # equal once rounded: no range
    assert fps.fmt([None, float("nan")]) == ""
    assert fps.fmt([0.5], 2) == "0.50"


def test_config_step_takes_each_shapes_latest_run():
    bench = [_bench("r1", "1111111", "S1", 300.0, label="cute-hopper[config=vec4,graph=True]",
                    family="hopper_bf16_decode"),
             _bench("r2", "2222222", "S1", 200.0, label="cute-hopper[config=vec4,graph=True]",
                    family="hopper_bf16_decode"),
             _bench("r3", "3333333", "S1", 100.0, label="cute-hopper[config=vec4,graph=True]",
                    family="hopper_smem")]  # another family's config of the same name: not step 1's
    recs = fps.step_rows(1, bench, [])
    times = [r for r in recs if "median us" in r["what"]]
    assert [(r["source"], r["commit"], r["value"]) for r in times] == [("bench run r2", "2222222", 200.0)]


def test_default_step_names_its_runs_and_gpu():
    bench = [_bench("a", "c862942", "S4", 16.9), _bench("b", "146899c", "S4", 17.5),
             _bench("c", "c862942", "S4", 70.0, label="triton[graph=True]", family="triton")]
    recs = fps.step_rows(30, bench, [])
    times = [r for r in recs if "median us" in r["what"]]
    assert [(r["source"], r["GPU"], r["value"]) for r in times] == [("bench run a", "H100", 16.9)]


def test_history_rows_profile_checks_and_timeline():
    hist = [_hist(2, "profile span", "S1", sum_us=170.1, span_us=None, kernels_us={"Gemm": 130.0}),
            _hist(2, "profile span", "S1", sum_us=170.9, span_us=None, kernels_us={"Gemm": 131.0}),
            _hist(2, "dev check", "C1", check="ok", rel_err=1e-5, config="good"),
            _hist(2, "dev check", "C1", check="FAIL", rel_err=1.4, config="bad_f"),
            _hist(3, "profile span", "S4", sum_us=99.0, span_us=None)]  # round 3: another step's
    recs = fps.step_rows(10, [], hist)  # step 10 = development round 2
    cells = {(r["what"], r["problem"]): r for r in recs}
    s = cells[("cfg: kernel-time sum us", "S1")]
    assert fps.fmt(s["value_list"]) == "170.5 (170.1-170.9)" and s["GPU"] == fps.NO_GPU
    assert s["source"] == "log x.log" and s["commit"] == "abcdef1"
    check = cells[("exactness checks", "checks")]["text"]
    assert check.startswith("1 of 2 ok") and check.endswith("not ok: bad_f")
    assert not any(r["problem"] == "S4" for r in recs)

    tl = [_hist(24, "timeline", "S4", section="GEMM alone",
                points={"entry": [0, 0.0, 0.5], "first_stage": [2.0, 2.8, 3.0], "weights_issued": [-9e15] * 3})]
    got = [(r["what"], r["text"]) for r in fps.step_rows(24, [], tl)]
    assert got == [("cfg section=GEMM alone: entry at us, median CTA [first-last]", "0.00 [0.00-0.50]"),
                   ("cfg section=GEMM alone: first_stage at us, median CTA [first-last]", "2.80 [2.00-3.00]")]
    # the unwritten stamp (a huge negative time) is skipped


def test_step_table_on_the_recorded_data_covers_every_step():
    t = fps.step_table()
    assert list(t.index.names) == ["step", "source", "commit", "GPU", "what"]
    assert {s[0] for s in FAST_PATH} == set(t.index.get_level_values("step"))
    assert list(t.columns[:4]) == ["S1", "S2", "S3", "S4"]
    gpus = set(t.index.get_level_values("GPU"))
    assert fps.NO_GPU in gpus and "H200" in gpus  # development logs without a GPU; round 28 on an H200


def test_run_summary_is_the_rows_of_that_run():
    s = fps.run_summary("c862942")
    assert s["commit"] == "c862942" and s["gpu"].startswith("NVIDIA H100")
    s4 = s["shapes"]["S4"]
    assert math.isclose(s4["x_floor"], s4["us"] / s4["floor_us"], rel_tol=1e-3)
    assert s4["vs_fastest_peer"] > 1 and not s4["fastest_peer"].startswith("cute-")
    assert fps.run_summary("0000000") == {}
