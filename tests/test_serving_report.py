"""The serving-path report (notebook 10): which rows it picks and how it judges issue 18's targets, no GPU."""
import pandas as pd
import pytest

from nvfp4lib import BENCHMARK, DUAL
from nvfp4lib.bench import roofline as rl
from nvfp4lib.study import gather_report as gr
from nvfp4lib.study import serving_report as sr

H100 = "NVIDIA H100 80GB HBM3"
MEASURED = {"bf16_tflops": 769.0, "copy_gbps": 2955.0}


def _row(problem, call, per_call_us, run="20261125T000000Z-a", status="ok", host_us=5.0):
    return {"problem": problem.name, "call": call, "backend": "cute-hopper", "status": status, "run_id": run,
            "git_commit": "abc1234def", "gpu": H100, "median_us": per_call_us, "host_us": host_us,
            "per_call_us": max(per_call_us, host_us), "flops": problem.flops(), "nvfp4_bytes": problem.nvfp4_bytes(),
            "floor_us": rl.floor_us(problem, MEASURED), "ceil_copy_gbps": MEASURED["copy_gbps"],
            "input_mode": "uniform", "config": "c", "date": "2026-11-25T00:00:00+00:00", "iters": 30}


def test_latest_ok_row_per_form_and_ratios_on_the_per_call_time():
    s4 = BENCHMARK[3]
    rows = pd.DataFrame([_row(s4, "graph", 20.0, run="20261125T000000Z-a"),
                         _row(s4, "graph", 18.0, run="20261125T010000Z-b"),
                         _row(s4, "graph", 1.0, run="20261125T020000Z-c", status="wrong: rel_err 1"),
                         _row(s4, "eager", 20.0, host_us=30.0)])
    latest = sr.latest_calls(rows, [s4])
    assert list(latest["call"]) == ["graph", "eager"]
    assert float(latest.iloc[0]["per_call_us"]) == 18.0  # the latest ok run, not the later wrong one
    eager = latest.iloc[1]
    assert eager["x_floor_measured"] == pytest.approx(30.0 / rl.floor_us(s4, MEASURED))  # host-bound: host time
    assert eager["x_floor_datasheet"] == pytest.approx(30.0 / rl.floor_us(s4, rl.H100_SXM_DATASHEET))
    missing = sr.missing_calls(rows, [s4])
    assert set(missing["call"]) == {"oneshot", "harness"} and set(missing["status"]) == {"never run"}


def test_targets_hold_and_miss_as_issue_18_states_them():
    s4, s4d = BENCHMARK[3], DUAL[3]
    rows = pd.DataFrame([_row(s4, "graph", 18.0), _row(s4, "eager", 29.0), _row(s4, "oneshot", 78.0),
                         _row(s4, "harness", 200.0), _row(s4d, "graph", 26.0), _row(s4d, "eager", 40.0)])
    ref = pd.DataFrame({"graph us": [17.0, 28.0]}, index=["S4", "S4-dual"])
    t = sr.targets(sr.latest_calls(rows, [s4, s4d]), [s4, s4d], ref)["verdict"]
    assert t["S4", "graph <= 1.1 x host-scheduled graph"] == "holds"  # 18 <= 18.7
    assert t["S4", "eager <= 1.1 x graph + 10 us"] == "holds"  # 29 <= 29.8
    assert t["S4", "oneshot <= 2 x eager + 20 us"] == "holds"  # 78 <= 2 x 29 + 20 (the limit itself holds)
    assert t["S4", "harness < B200 baseline"] == "misses"  # 200 >= 156
    assert t["S4-dual", "eager <= 1.1 x graph + 10 us"] == "misses"  # 40 > 38.6
    assert t["S4-dual", "oneshot <= 2 x eager + 20 us"] == "no data"
    assert ("S4-dual", "harness < B200 baseline") not in t.index  # the baseline is of the single GEMMs


def test_history_has_one_column_per_clean_run_oldest_first():
    s4 = BENCHMARK[3]
    old = {**_row(s4, "oneshot", 200.0, run="20261124T000000Z-a"), "git_commit": "aaaaaaa1", "date": "2026-11-24"}
    new = {**_row(s4, "oneshot", 140.0, run="20261125T000000Z-b"), "git_commit": "bbbbbbb2"}
    dirty = {**_row(s4, "oneshot", 1.0, run="20261125T050000Z-c"), "git_commit": "ccccccc3", "git_dirty": True}
    graph = {**_row(s4, "graph", 18.0, run="20261125T000000Z-b"), "git_commit": "bbbbbbb2"}
    h = sr.history(pd.DataFrame([new, dirty, old, graph]), [s4])
    assert list(h.columns) == ["aaaaaaa 2026-11-24", "bbbbbbb 2026-11-25"]  # the dirty run left out
    assert h.loc[("S4", "oneshot")].tolist() == [200.0, 140.0]
    assert list(h.index) == [("S4", "graph"), ("S4", "oneshot")]


def test_back_to_back_subtracts_the_flushes(monkeypatch):
    """calls.back_to_back on a fake clock: each call costs 7 units, each flush 3: per call 7, flushes 3."""
    from nvfp4lib.bench import calls

    clock = [0.0]

    class FakeTime:
        @staticmethod
        def perf_counter():
            return clock[0]

    def advance(us):
        clock[0] += us * 1e-6

    seen = []
    monkeypatch.setattr(calls, "time", FakeTime)
    got = calls.back_to_back(lambda i: (seen.append(i), advance(7.0)), lambda: advance(3.0), iters=10,
                             sync=lambda: advance(0.0))
    assert abs(got["b2b_us"] - 7.0) < 1e-6 and abs(got["b2b_flush_us"] - 3.0) < 1e-6
    assert seen == [0] + list(range(10))  # one warm-up call, then each index once


def test_back_to_back_table_sets_eager_against_graph():
    s4, s3 = BENCHMARK[3], BENCHMARK[2]
    rows = [_row(s4, "graph", 18.0), _row(s4, "eager", 50.0, host_us=45.0), _row(s3, "graph", 33.0)]
    for r, b2b in zip(rows, (17.0, 19.0, 32.0)):
        r["b2b_us"] = b2b
    t = sr.back_to_back(sr.latest_calls(pd.DataFrame(rows), [s4, s3]))
    assert list(t.index) == ["S4", "S3"]
    assert t.loc["S4", "eager / graph, back to back"] == pytest.approx(19.0 / 17.0)
    assert t.loc["S4", "eager per call us"] == 50.0 and pd.isna(t.loc["S3", "eager / graph, back to back"])
    assert len(sr.back_to_back(sr.latest_calls(pd.DataFrame([_row(s4, "graph", 18.0)]), [s4]))) == 0  # no b2b column


def test_gather_ab_pairs_two_commits_by_median_over_runs():
    def row(commit, run, part, us, kcu=8, warps=4, ok=True):
        return {"problem": "S1", "part": part, "git_commit": commit, "run_id": run, "kcu": kcu, "warps": warps,
                "median_us": us, "ratio_to_floor": us / 90.0, "identical": ok, "status": "ok"}

    rows = pd.DataFrame([row("aaaaaaa1", "r1", "weights", 150.0), row("bbbbbbb2", "r2", "weights", 120.0),
                         row("aaaaaaa1", "r3", "weights", 154.0), row("bbbbbbb2", "r4", "weights", 124.0),
                         row("bbbbbbb2", "r4", "weights", 60.0, kcu=4),  # another knob: not compared
                         row("ccccccc3", "r5", "weights", 10.0)])  # a third commit: ignored
    ab = gr.gather_ab(rows, "aaaaaaa", "bbbbbbb", [BENCHMARK[0]])
    got = ab.loc[("S1", "weights")]
    assert got["aaaaaaa us"] == 152.0 and got["bbbbbbb us"] == 122.0
    assert got["after / before"] == pytest.approx(122.0 / 152.0) and got["runs"] == 2 and bool(got["identical"])
    assert gr.gather_ab(rows, "aaaaaaa", "ddddddd").empty  # no rows of one side: nothing to compare


def test_gather_rows_of_other_knob_settings_are_kept_apart():
    """Rows carrying knob values (since db7e1a9) count as the shipped gather only at the package's defaults; rows
    from before the knobs count as their commit's code. ``gather_variants`` shows every setting of every run."""
    from nvfp4lib.kernels.hopper_varlen.gather import PREFETCH

    def row(commit, run, us, date, **knobs):
        return {"problem": "S1", "part": "weights", "git_commit": commit, "run_id": run, "kcu": 8, "warps": 4,
                "median_us": us, "ratio_to_floor": us / 90.0, "identical": True, "status": "ok", "date": date,
                **knobs}

    rows = pd.DataFrame([row("aaaaaaa1", "r1", 122.0, "2026-11-26T21:19:00"),
                         row("bbbbbbb2", "r1", 117.0, "2026-11-26T21:19:00", prefetch=1 - PREFETCH),
                         row("bbbbbbb2", "r1", 115.0, "2026-11-26T21:19:00", prefetch=PREFETCH),
                         row("bbbbbbb2", "r1", 99.0, "2026-11-26T21:19:00", prefetch=PREFETCH, prmt=1),
                         row("bbbbbbb2", "r2", 116.0, "2026-11-26T21:40:00", prefetch=PREFETCH)])
    ab = gr.gather_ab(rows, "aaaaaaa", "bbbbbbb", [BENCHMARK[0]])
    assert ab.loc[("S1", "weights"), "bbbbbbb us"] == 115.5  # r1's and r2's shipped rows only
    assert gr.gather_table(rows, [BENCHMARK[0]]).loc["S1", "weights kcu=8 us"] == 116.0  # the latest run, shipped
    v = gr.gather_variants(rows, ["aaaaaaa", "bbbbbbb"], [BENCHMARK[0]])
    assert v.loc["S1", ("21:19 aaaaaaa", "as shipped")] == 122.0
    assert v.loc["S1", ("21:19 bbbbbbb", f"prefetch={PREFETCH} prmt=1")] == 99.0
    assert v.loc["S1", ("21:19 bbbbbbb", f"prefetch={1 - PREFETCH}")] == 117.0
    assert v.loc["S1", ("21:40 bbbbbbb", f"prefetch={PREFETCH}")] == 116.0
    assert gr.gather_variants(rows, ["ddddddd"]).empty


def test_calls_ab_pairs_runs_of_one_form_by_commit():
    def row(commit, run, call, us, host=50.0):
        return {"problem": "S1", "call": call, "git_commit": commit, "run_id": run, "per_call_us": us,
                "host_us": host, "b2b_us": us - 20, "status": "ok"}

    rows = pd.DataFrame([row("bbbbbbb2", "r0", "oneshot", 999.0),  # an earlier sequence (another machine): ignored
                         row("bbbbbbb2", "r0x", "oneshot", 9.0), row("bbbbbbb2", "r0x", "eager", 5.0),  # a full run
                         row("aaaaaaa1", "r1", "oneshot", 320.0), row("bbbbbbb2", "r2", "oneshot", 290.0, 40.0),
                         row("aaaaaaa1", "r3", "oneshot", 330.0), row("bbbbbbb2", "r4", "oneshot", 294.0, 44.0),
                         row("bbbbbbb2", "r5", "oneshot", 10.0), row("bbbbbbb2", "r5", "eager", 5.0)])  # a full run
    ab = sr.calls_ab(rows, "aaaaaaa", "bbbbbbb", "oneshot", [BENCHMARK[0]])
    got = ab.loc["S1"]
    assert got["per call aaaaaaa"] == 325.0 and got["per call bbbbbbb"] == 292.0 and got["host bbbbbbb"] == 42.0
    assert got["back to back aaaaaaa"] == 305.0 and got["runs"] == 2
    assert got["per call after / before"] == pytest.approx(292.0 / 325.0)
    assert sr.calls_ab(rows, "aaaaaaa", "ddddddd").empty


def test_runs_used_shows_the_hosts_state():
    """A run's host state (calls.host_probe, measured once per run) sits beside its provenance; older runs show None.
    On a machine without a GPU the probe times the idle case only."""
    from nvfp4lib.bench.calls import host_probe

    probe = host_probe(reads=10, samples=3)
    assert probe["host_probe_idle_us"] > 0 and "host_probe_busy_us" not in probe
    rows = pd.DataFrame([{**_row(BENCHMARK[0], "eager", 40.0, run="r2"), **probe, "host_probe_busy_us": 99.0},
                         _row(BENCHMARK[0], "graph", 30.0, run="r1")])
    used = sr.runs_used(sr.latest_calls(rows, [BENCHMARK[0]]))
    assert used.loc["r2", "host probe us (GPU busy)"] == 99.0
    assert used.loc["r2", "host probe us (GPU idle)"] == probe["host_probe_idle_us"]
    assert pd.isna(used.loc["r1", "host probe us (GPU busy)"])


def test_a_run_of_rounds_is_judged_by_its_median_round():
    s4 = BENCHMARK[3]
    run = "20261126T000000Z-r"
    rows = [{**_row(s4, "eager", t, run=run), "round": i, "rounds": 4} for i, t in enumerate((40.0, 25.0, 90.0, 30.0))]
    rows.append({**_row(s4, "eager", 1.0, run=run, status="wrong: rel_err 1"), "round": 4, "rounds": 5})
    rows.append({**_row(s4, "eager", 10.0, run="20261125T000000Z-old"), "git_commit": "0ld0ld0ld",
                 "date": "2026-11-25"})  # an older run, left out
    latest = sr.latest_calls(pd.DataFrame(rows), [s4])
    r = latest.iloc[0]
    assert len(latest) == 1 and r["per_call_us"] == 30.0  # of 25, 30, 40, 90: the lower middle one
    assert (r["rounds_ok"], r["rounds_not_ok"], r["per_call_min_us"], r["per_call_max_us"]) == (4, 1, 25.0, 90.0)
    assert sr.calls_table(latest).loc[("S4", "eager"), "rounds not ok"] == 1
    h = sr.history(pd.DataFrame(rows), [s4])
    assert h.loc[("S4", "eager")].tolist() == [10.0, 30.0]


def test_median_round_picks_the_middle_row_per_form():
    from nvfp4lib.bench.calls import median_round

    rows = [{"problem": "S4", "call": "eager", "per_call_us": t, "round": i} for i, t in enumerate((50.0, 20.0, 30.0))]
    rows += [{"problem": "S4", "call": "harness", "status": "skipped"}]
    got = median_round(rows)
    assert [(r["call"], r.get("round")) for r in got] == [("eager", 2), ("harness", None)]
    assert (got[0]["per_call_min_us"], got[0]["per_call_max_us"]) == (20.0, 50.0)


def test_knob_runs_stay_out_of_the_headline_and_form_an_ab():
    """A knob's A/B (the runs of a commit that set a calls knob both ways: fused_prologue) is left out of latest_calls
    and history, its shipped side too; knob_ab pairs both settings of the latest commit that ran both, per (problem,
    call), medians over runs. Runs of the shipped setting alone count as usual."""
    s4 = BENCHMARK[3]
    ab = {"git_commit": "fedcba98", "date": "2026-11-27T00:00:00+00:00"}
    off1 = {**_row(s4, "eager", 20.0, run="20261127T000000Z-a", host_us=30.0), "fused_prologue": 0, **ab}
    on1 = {**_row(s4, "eager", 21.0, run="20261127T000100Z-b", host_us=26.0), "fused_prologue": 1, **ab}
    off2 = {**_row(s4, "eager", 20.0, run="20261127T000200Z-c", host_us=32.0), "fused_prologue": 0, **ab}
    on2 = {**_row(s4, "eager", 21.0, run="20261127T000300Z-d", host_us=28.0), "fused_prologue": 1, **ab}
    full = {**_row(s4, "eager", 19.0, run="20261126T000000Z-y", host_us=25.0), "fused_prologue": 0}
    before = {**_row(s4, "graph", 18.0, run="20261126T000000Z-z")}  # from before the knob: as shipped
    rows = pd.DataFrame([off1, on1, off2, on2, full, before])
    latest = sr.latest_calls(rows, [s4]).set_index("call")
    assert latest.loc["eager", "run_id"] == "20261126T000000Z-y"  # not the later A/B's shipped side
    assert latest.loc["graph", "run_id"] == "20261126T000000Z-z"
    assert list(sr.history(rows, [s4]).columns) == ["abc1234 2026-11-25"]
    ab = sr.knob_ab(rows, "fused_prologue", [s4])
    r = ab.loc[("S4", "eager")]
    assert r["runs"] == 4 and r["host off"] == 31.0 and r["host on"] == 27.0 and r["host on - off"] == -4.0
    assert r["per call on - off"] == pytest.approx(27.0 - 31.0)
    assert sr.knob_ab(rows[rows["fused_prologue"] != 1], "fused_prologue").empty  # one setting: no A/B


def test_verdicts_by_run_counts_each_full_runs_targets_beside_its_host():
    """One line per run that timed graph, eager and oneshot on every problem: the targets that held, and the host
    time of its graph replays and eager calls (a partial run is left out)."""
    s4 = BENCHMARK[3]

    def run(name, eager, eager_host):
        return [_row(s4, "graph", 18.0, run=name, host_us=4.0), _row(s4, "eager", eager, run=name, host_us=eager_host),
                _row(s4, "oneshot", 60.0, run=name, host_us=50.0)]

    rows = pd.DataFrame(run("20261125T000000Z-a", 16.0, 25.0) + run("20261125T010000Z-b", 16.0, 45.0)
                        + [_row(s4, "graph", 18.0, run="20261125T020000Z-c")])
    v = sr.verdicts_by_run(rows, [s4])
    assert list(v.index) == ["20261125T000000Z-a", "20261125T010000Z-b"]
    assert list(v["eager"]) == ["1 of 1", "0 of 1"]  # 25 <= 1.1 * 18 + 10 = 29.8 < 45
    assert list(v["oneshot"]) == ["1 of 1", "1 of 1"]  # 60 <= 2 * 45 + 20 (the slow host's eager raises the limit)
    assert list(v["eager host us"]) == [25.0, 45.0] and list(v["graph host us"]) == [4.0, 4.0]
    assert "graph" not in v  # no host-scheduled reference given: no graph target


def _full_run(problem, run, graph=18.0, eager=25.0, oneshot=60.0, commit="abc1234def", eager_host=20.0):
    rows = [_row(problem, "graph", graph, run=run, host_us=4.0), _row(problem, "eager", eager, run=run,
                                                                       host_us=eager_host),
            _row(problem, "oneshot", oneshot, run=run, host_us=50.0)]
    return [{**r, "git_commit": commit} for r in rows]


def test_the_verdict_is_the_latest_run_that_timed_every_form():
    """The answer comes from one run: the latest that timed graph, eager and oneshot on every problem; a later partial
    run is named, not judged. Its tables show no NaN ('—' for a missing value)."""
    s4 = BENCHMARK[3]
    rows = pd.DataFrame(_full_run(s4, "20261125T000000Z-a", eager=40.0, commit="aaaaaaa1")
                        + _full_run(s4, "20261125T010000Z-b", eager=25.0, commit="bbbbbbb2")
                        + [_row(s4, "graph", 17.0, run="20261125T020000Z-c")])
    assert sr.full_runs(rows, [s4]) == ["20261125T000000Z-a", "20261125T010000Z-b"]
    v = sr.verdict(rows, [s4])
    assert (v.run, v.commit) == ("20261125T010000Z-b", "bbbbbbb")
    assert v.later == ["20261125T020000Z-c"]
    assert v.held == {"eager": (1, 1), "oneshot": (1, 1)}  # no reference given: no graph target
    assert v.table.loc[("S4", "eager"), "verdict"] == "holds" and v.table.loc[("S4", "graph"), "verdict"] == "no target"
    assert v.table.loc[("S4", "eager"), "limit us"] == pytest.approx(1.1 * 18.0 + 10)
    assert any("held: 2 of 2" in line for line in v.lines())
    assert v.summary().loc["eager", "held on"] == "1 of 1"
    shown = sr.shown(v.table, 2)
    assert shown.loc[("S4", "graph"), "limit us"] == "—" and not shown.isna().any().any()
    assert sr.verdict(rows, [s4], run="20261125T000000Z-a").held["eager"] == (0, 1)  # 40 > 29.8
    assert sr.verdict(rows.iloc[0:0], [s4]) is None


def test_misses_by_shape_counts_the_runs_each_target_missed():
    s4 = BENCHMARK[3]
    rows = pd.DataFrame(_full_run(s4, "20261125T000000Z-a", eager=40.0, commit="aaaaaaa1")
                        + _full_run(s4, "20261125T010000Z-b", eager=25.0, commit="bbbbbbb2"))
    m = sr.misses_by_shape(rows, [s4])
    assert m.loc["S4", "eager missed"] == "1 of 2" and m.loc["S4", "eager last missed at"] == "aaaaaaa"
    assert m.loc["S4", "oneshot missed"] == "0 of 2" and m.loc["S4", "oneshot last missed at"] == "—"
    corr = sr.host_correlation(sr.verdicts_by_run(rows, [s4]))
    assert corr.loc["eager", "runs"] == 2


def test_rounds_outcomes_are_computed_from_rows_or_marked_not_recorded():
    """A round's outcome names the runs it rests on; a round without recorded rows says so, whatever its kind."""
    from nvfp4lib.study import serving_rounds as rd

    def g(commit, run, us):
        return {"problem": "S1", "part": "weights", "git_commit": commit, "run_id": run, "kcu": 8, "warps": 4,
                "median_us": us, "ratio_to_floor": us / 90.0, "identical": True, "status": "ok"}

    gather = pd.DataFrame([g("aaaaaaa1", "r1", 150.0), g("bbbbbbb2", "r2", 120.0)])
    src = rd.Sources(pd.DataFrame(), gather, [BENCHMARK[0]])
    rounds = (rd.Round("a change", "bbbbbbb", "S1 150 -> ~100 us", rd.gather_pair("aaaaaaa", "bbbbbbb", ("S1",))),
              rd.Round("another", "ccccccc", "faster", measured_by="a development script"),
              rd.Round("a third", "ddddddd", "faster", rd.gather_pair("aaaaaaa", "ddddddd")))
    t = rd.rounds_table(src, rounds)
    assert "S1 150.0 → 120.0" in t.loc[1, "outcome"] and t.loc[1, "run"] == "r1, r2"
    assert t.loc[2, "outcome"] == f"{rd.NOT_RECORDED} (a development script)" and t.loc[2, "run"] == "—"
    assert t.loc[3, "outcome"] == rd.NOT_RECORDED
    empty = rd.rounds_table(rd.Sources(pd.DataFrame(), pd.DataFrame(), list(BENCHMARK)))
    assert len(empty) == len(rd.ROUNDS) and set(empty["outcome"].str[:len(rd.NOT_RECORDED)]) == {rd.NOT_RECORDED}


def test_serving_against_host_pairs_the_latest_run_that_timed_both():
    def row(run, problem, config, us, named=False, status="ok"):
        opts = {"graph": True, **({"config": config} if named else {})}
        return {"run_id": run, "problem": problem, "backend": "cute-hopper", "options": opts, "config": config,
                "median_us": us, "status": status, "gpu": "H100", "git_commit": "abcdef0123"}

    rows = pd.DataFrame([
        row("r1", "S4", "vl_a", 30.0), row("r1", "S4", "rs_a", 20.0, named=True),  # older: not used
        row("r2", "S4", "vl_a", 18.0), row("r2", "S4", "rs_a", 17.0, named=True), row("r2", "S4", "vl_a", 19.0),
        row("r2", "S4", "vl_b", 1.0, named=True),  # a named serving config is not the serving kernel as shipped
        row("r2", "S3", "vl_a", 10.0), row("r2", "S3", "rs_a", 12.0, named=True),
        row("r2", "S2", "vl_a", 10.0),  # no host-scheduled row: left out
        row("r3", "S1", "vl_a", 5.0), row("r3", "S1", "rs_a", 1.0, named=True, status="error: x"),  # not ok
    ])
    later = pd.DataFrame([row("r4", "S4", "vl_a", 9.0), row("r4", "S4", "rs_a", 10.0, named=True)]).assign(gpu="H200")
    both = pd.concat([rows, later], ignore_index=True)
    assert sr.serving_against_host(both).loc["S4", "run"] == "r4"  # any card: the latest run
    assert sr.serving_against_host(both, gpu="H200").index.tolist() == ["S4"]
    t = sr.serving_against_host(both, gpu="H100")
    assert list(t.index) == ["S4", "S3"]
    assert t.loc["S4", "serving us"] == 18.5 and t.loc["S4", "serving rows"] == 2 and t.loc["S4", "run"] == "r2"
    assert t.loc["S4", "serving / host-scheduled"] == pytest.approx(18.5 / 17.0)
    assert not t.loc["S4", "<= 1 (issue 41)"] and t.loc["S3", "<= 1 (issue 41)"]
    assert sr.serving_against_host(pd.DataFrame()).empty
    # a run at a commit whose auto rule is not shipped now (an A/B arm) does not count
    arm = pd.DataFrame([row("r5", "S4", "vl_c", 8.0), row("r5", "S4", "rs_a", 10.0, named=True)]).assign(
        git_commit=next(iter(sr.AUTO_NOT_SHIPPED)) + "xyz")
    assert sr.serving_against_host(pd.concat([both, arm], ignore_index=True)).loc["S4", "run"] == "r4"


def test_auto_at_names_the_config_auto_ran_beside_the_host_scheduled_kernel():
    def row(run, problem, config, us, graph=True, named=False, commit="abc1234"):
        opts = {"graph": graph, **({"config": config} if named else {})}
        return {"run_id": run, "problem": problem, "backend": "cute-hopper", "options": opts, "config": config,
                "median_us": us, "status": "ok", "git_commit": commit, "label": f"cute-hopper[graph={graph}]"}

    rows = pd.DataFrame([row("r1", "S2", "vl_t96", 65.0), row("r1", "S2", "vl_t96", 67.0),
                         row("r1", "S2", "rs_x", 64.0, named=True), row("r1", "S2", "vl_t96", 70.0, graph=False),
                         row("r1", "S2", "vl_t256", 66.0, named=True),
                         row("r0", "S2", "vl_old", 1.0, commit="fff0000")])
    from nvfp4lib.study import serving_rounds as rd

    src = rd.Sources(pd.DataFrame(), pd.DataFrame(), list(BENCHMARK), None, rows, rows)
    text, runs = rd.auto_at("abc1234", ("S2", "S1"))(src)
    assert text == "graph us: S2 vl_t96 66.0 (host-scheduled 64.0); eager us: S2 vl_t96 70.0" and runs == ["r1"]
    assert rd.auto_at("abc1234", ("S2",), table="tuned")(src)[0].startswith("graph us: S2 vl_t96 66.0")
    assert rd.auto_at("1111111", ("S2",))(src) is None


def test_floor_target_judges_each_graph_replay_against_the_measured_floor():
    latest = pd.DataFrame([{"problem": "S1", "call": "graph", "per_call_us": 140.0, "floor_measured_us": 100.0,
                            "x_floor_measured": 1.4},
                           {"problem": "S1", "call": "eager", "per_call_us": 900.0, "floor_measured_us": 100.0,
                            "x_floor_measured": 9.0},
                           {"problem": "S4", "call": "graph", "per_call_us": 20.0, "floor_measured_us": 8.0,
                            "x_floor_measured": 2.5}])
    ft = sr.floor_target(latest)
    assert list(ft.index) == ["S1", "S4"] and list(ft.iloc[:, -1]) == [True, False]
    assert sr.floor_target(pd.DataFrame()).empty


def test_rule_as_shipped_drops_tuned_rows_and_other_rules(monkeypatch):
    from nvfp4lib import tuning

    monkeypatch.setattr(tuning, "SHORT_K", 0)
    monkeypatch.setattr(tuning, "ONCE_WAIT", True)
    rows = pd.DataFrame([
        {"id": 1, "info_choice": "rule", "info_once_wait": True, "info_short_k": 0},
        {"id": 2, "info_choice": "tuned", "info_once_wait": True, "info_short_k": 0},  # a tuning cache's choice
        {"id": 3, "info_choice": "rule", "info_once_wait": True, "info_short_k": 4096},  # another rule
        {"id": 4, "info_choice": "rule", "info_once_wait": False, "info_short_k": 0},
        {"id": 5},  # from before the fields
    ])
    assert sr.rule_as_shipped(rows, "info_")["id"].tolist() == [1, 5]
    assert sr.rule_as_shipped(rows.rename(columns=lambda c: c.replace("info_", "")))["id"].tolist() == [1, 5]
    assert sr.rule_as_shipped(rows)["id"].tolist() == [1, 2, 3, 4, 5]  # (no such columns without the prefix)


def test_rule_as_shipped_tells_a_switch_from_a_number(monkeypatch):
    """dual_96 was an on/off switch in its first A/B and is a bucket now: True is not the bucket 1."""
    from nvfp4lib import tuning

    monkeypatch.setattr(tuning, "DUAL_96", 1)
    rows = pd.DataFrame([{"id": 1, "dual_96": 1}, {"id": 2, "dual_96": True}, {"id": 3, "dual_96": 64},
                         {"id": 4, "dual_96": None}])
    assert sr.rule_as_shipped(rows)["id"].tolist() == [1, 4]
    monkeypatch.setattr(tuning, "ONCE_WAIT", True)
    assert sr.rule_as_shipped(pd.DataFrame([{"id": 1, "once_wait": 1}, {"id": 2, "once_wait": True}]))["id"].tolist() \
        == [2]


def test_rule_as_shipped_leaves_out_the_narrow_tier_s_first_a_b():
    """tuning.NARROW_PAIR's rows carry its rule by slice length ("k32") or "off"; its first A/B's rows, without that
    rule (every slice length), carry bools, so neither of its arms is taken for the rule as shipped."""
    from nvfp4lib import tuning

    shipped = tuning.rule_knobs()["narrow_pair"]
    assert shipped == (f"k{tuning.NARROW_PAIR_MIN_K_TILES}" if tuning.NARROW_PAIR else "off")
    other = "off" if shipped != "off" else "k32"
    rows = pd.DataFrame([{"id": 1, "narrow_pair": shipped}, {"id": 2, "narrow_pair": True},
                         {"id": 3, "narrow_pair": False}, {"id": 4, "narrow_pair": other}, {"id": 5}])
    assert sr.rule_as_shipped(rows)["id"].tolist() == [1, 5]
