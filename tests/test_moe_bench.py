"""The MoE layer benchmark without a GPU: routing draws, floor arithmetic, the bf16 peer's forward against the
reference layer, the refusal to time on the CPU, and the report of notebook 11 on clearly synthetic rows (never
written to data/)."""
import math

import pandas as pd
import pytest
import torch

from nvfp4lib import tuning
from nvfp4lib.bench import moe_bench as mb
from nvfp4lib.bench.peers.bf16_moe import BF16GroupedMoE
from nvfp4lib.nn import NVFP4MoE, reference_moe
from nvfp4lib.study import moe_report as mr
from nvfp4lib.study import moe_rounds, moe_runs

CEIL = {"bf16_tflops": 750.0, "copy_gbps": 3000.0}


# --- routing -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("routing", mb.ROUTINGS)
@pytest.mark.parametrize("t,e,k", [(1, 8, 2), (64, 128, 8), (512, 256, 8), (33, 8, 8)])
def test_routing_shapes_distinct_experts_and_weights(routing, t, e, k):
    ids, w = mb.make_routing(t, e, k, routing, seed=5)
    assert ids.shape == (t, k) and w.shape == (t, k)
    assert ids.dtype == torch.int64 and w.dtype == torch.float32
    assert int(ids.min()) >= 0 and int(ids.max()) < e
    assert all(len(set(r.tolist())) == k for r in ids)  # k distinct experts per token
    assert torch.allclose(w.sum(-1), torch.ones(t)) and bool((w > 0).all())


@pytest.mark.parametrize("routing", mb.ROUTINGS)
def test_routing_is_deterministic_given_the_seed(routing):
    a = mb.make_routing(100, 64, 4, routing, seed=11)
    b = mb.make_routing(100, 64, 4, routing, seed=11)
    c = mb.make_routing(100, 64, 4, routing, seed=12)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_zipf_routing_is_skewed_and_uniform_is_not():
    t, e, k = 4096, 128, 8
    mean = t * k / e
    uni = torch.bincount(mb.make_routing(t, e, k, "uniform", seed=3)[0].flatten(), minlength=e).float()
    zipf = torch.bincount(mb.make_routing(t, e, k, "zipf", seed=3)[0].flatten(), minlength=e).float()
    assert float(uni.max()) < 1.3 * mean and float(uni.min()) > 0.7 * mean
    assert float(zipf.max()) > 3 * mean  # the most popular expert
    top8 = zipf.sort(descending=True).values[:8].sum() / zipf.sum()
    assert float(top8) > 0.35  # 8 of 128 experts take over a third of the copies (uniform: 1/16)
    # the popular experts are a seeded permutation, not always expert 0
    other = torch.bincount(mb.make_routing(t, e, k, "zipf", seed=4)[0].flatten(), minlength=e)
    assert int(zipf.argmax()) != int(other.argmax()) or int(zipf.argsort()[-2]) != int(other.argsort()[-2])


def test_routing_refuses_bad_arguments():
    with pytest.raises(ValueError, match="routing"):
        mb.make_routing(4, 8, 2, "gaussian")
    with pytest.raises(ValueError, match="top_k"):
        mb.make_routing(4, 8, 9, "uniform")


# --- floors --------------------------------------------------------------------------------------------------------

def test_layer_shapes_and_bytes():
    ds = mb.get_layer("deepseek-v3")
    assert (ds.experts, ds.top_k, ds.hidden, ds.intermediate) == (256, 8, 7168, 2048)
    assert mb.get_layer("Mixtral-like") == mb.LAYERS[2]
    assert ds.weight_bytes("bf16") == 256 * 3 * 2048 * 7168 * 2  # 22.5 GB, the issue's figure
    n = 3 * 2048 * 7168
    assert ds.expert_bytes("nvfp4") == n // 2 + n // 16 + 12
    assert ds.weight_bytes("bf16") / ds.weight_bytes("nvfp4") == pytest.approx(3.56, abs=0.01)
    assert ds.flops(4) == 2 * 4 * 8 * 3 * 7168 * 2048
    with pytest.raises(ValueError, match="unknown MoE layer"):
        mb.get_layer("llama")


def test_floor_is_touched_bytes_for_decode_and_flops_for_prefill():
    mx = mb.get_layer("mixtral")
    # T=1, k=2: two experts touched, memory-bound
    f = mb.moe_floor_us(mx, 1, 2, CEIL, "nvfp4")
    assert f == pytest.approx(2 * mx.expert_bytes("nvfp4") / 3000e9 * 1e6)
    assert mb.floor_bound(mx, 1, 2, CEIL) == "memory"
    assert mb.moe_floor_us(mx, 1, 2, CEIL, "bf16") == pytest.approx(2 * mx.expert_bytes("bf16") / 3000e9 * 1e6)
    # T=4096: all 8 experts, compute-bound; both formats share the FLOPs floor
    f = mb.moe_floor_us(mx, 4096, 8, CEIL, "nvfp4")
    assert f == pytest.approx(mx.flops(4096) / 750e12 * 1e6)
    assert mb.moe_floor_us(mx, 4096, 8, CEIL, "bf16") == pytest.approx(f)
    assert mb.floor_bound(mx, 4096, 8, CEIL) == "compute"
    ids, _ = mb.make_routing(1, 256, 8, "uniform", seed=0)
    assert mb.touched_experts(ids) == 8


# --- the bf16 peer on the CPU --------------------------------------------------------------------------------------

@pytest.mark.parametrize("e,k,h,i", [(8, 2, 64, 32), (16, 4, 128, 64), (4, 1, 256, 128)])
@pytest.mark.parametrize("routing", mb.ROUTINGS)
def test_bf16_peer_matches_the_reference_layer(e, k, h, i, routing):
    layer = mb.MoELayer("tiny", e, k, h, i)
    gate, up, down = mb.make_weights(layer, seed=1, device="cpu")
    peer = BF16GroupedMoE(gate, up, down)
    assert peer.weight_bytes == layer.weight_bytes("bf16")
    for t in (1, 5, 37):
        ids, w = mb.make_routing(t, e, k, routing, seed=t)
        x = torch.randn(t, h, generator=torch.Generator().manual_seed(t)).to(torch.bfloat16)
        ref = reference_moe(x, ids, w, gate, up, down, activations="bf16")
        out = peer(x, ids, w)
        assert out.dtype == torch.bfloat16 and out.shape == (t, h)
        err = mb._rel_err(out.float(), ref)
        assert err <= mb.TOL["peer"] / 2, err  # the bench's tolerance with a 2x margin
        # a wrong routing is far outside it
        assert mb._rel_err(peer(x, (ids + 1) % e, w).float(), ref) > 10 * mb.TOL["peer"]


def test_bf16_peer_with_experts_that_get_no_tokens():
    layer = mb.MoELayer("tiny", 8, 2, 64, 32)
    gate, up, down = mb.make_weights(layer, seed=2, device="cpu")
    ids = torch.tensor([[3, 5], [5, 3], [3, 5]])
    w = torch.full((3, 2), 0.5)
    x = torch.randn(3, 64).to(torch.bfloat16)
    out = BF16GroupedMoE(gate, up, down)(x, ids, w)
    ref = reference_moe(x, ids, w, gate, up, down, activations="bf16")
    assert mb._rel_err(out.float(), ref) <= mb.TOL["peer"]


def test_nvfp4_layer_reference_backend_within_the_bench_tolerance():
    # the semantics the GPU layer is checked against, run through the layer's reference backend on the CPU
    layer = mb.MoELayer("tiny", 8, 2, 64, 32)
    gate, up, down = mb.make_weights(layer, seed=3, device="cpu")
    ids, w = mb.make_routing(9, 8, 2, "zipf", seed=9)
    x = torch.randn(9, 64).to(torch.bfloat16)
    for mode in mb.MODES:
        out = NVFP4MoE(gate, up, down, activations=mode, backend="reference")(x, ids, w)
        ref = reference_moe(x, ids, w, gate, up, down, activations=mode)
        assert mb._rel_err(out.float(), ref) <= mb.TOL[mode]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_bench_moe_refuses_without_a_gpu():
    with pytest.raises(RuntimeError, match="bench_moe needs a CUDA GPU"):
        mb.bench_moe(["qwen3-moe"], [1], ["uniform"])


def test_profiled_row_prints_its_kernels_and_the_flag_reaches_bench_moe(capsys, monkeypatch):
    prof = {"span_us": 12.5, "kernels_per_call": 2, "iters": 3,
            "kernels": [{"name": "_route_kernel", "category": "nvfp4lib Triton", "median_us": 2.0, "start_us": 0.0},
                        {"name": "GroupedVarlenGemmSm90", "category": "serving kernel", "median_us": 9.0,
                         "start_us": 3.5}]}
    row = {"layer": "qwen3-moe", "tokens": 1, "routing": "uniform", "label": "NVFP4 W4A4", "median_us": 14.0,
           "ratio": 2.0, "floor_us": 7.0, "status": "ok", "profile": prof}
    mb._print_row(row)
    out = capsys.readouterr().out
    assert "span 12.5 us, 2 kernels per call" in out and "+    9.0 us  GroupedVarlenGemmSm90" in out
    seen = {}
    monkeypatch.setattr(mb.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mb, "bench_moe", lambda *a, **k: seen.update(k) or [])
    import argparse

    parser = argparse.ArgumentParser()
    mb.add_command(parser.add_subparsers(), lambda p, *a: None, lambda *a: None)
    args = parser.parse_args(["moe-bench", "--layer", "qwen3-moe", "--tokens", "1", "--profile"])
    assert args.fn(args) == 0 and seen["profile"] is True


# --- the report, on synthetic rows ---------------------------------------------------------------------------------

SYNTH = "SYNTHETIC-test-row"  # marks every row below: made up here, never measured, never written to data/


def _row(layer, t, routing, kind, us, run="20261201T000000Z-synth", status="ok", touched=None,
         commit="0000000synthetic"):
    lay = mb.get_layer(layer)
    touched = touched or min(lay.experts, t * lay.top_k)
    fmt = "bf16" if kind == "peer" else "nvfp4"
    fl = {f: mb.moe_floor_us(lay, t, touched, CEIL, f) for f in ("nvfp4", "bf16")}
    r = {"run_id": run, "host": SYNTH, "git_commit": commit, "git_dirty": False,
         "date": "2026-12-01T00:00:00+00:00", "gpu": "NVIDIA H100 80GB HBM3", "iters": 30,
         "ceil_bf16_tflops": CEIL["bf16_tflops"], "ceil_copy_gbps": CEIL["copy_gbps"], "layer": lay.name,
         "like": lay.like, "experts": lay.experts, "top_k": lay.top_k, "hidden": lay.hidden,
         "intermediate": lay.intermediate, "tokens": t, "routing": routing, "touched_experts": touched,
         "mode": "bf16-weights" if kind == "peer" else kind, "label": mb.LABELS[kind],
         "backend": mb.PEER_BACKEND if kind == "peer" else mb.NVFP4_BACKEND, "weight_bytes": lay.weight_bytes(fmt),
         "held_bytes": lay.weight_bytes(fmt) * (2 if kind != "peer" else 1), "floor_nvfp4_us": fl["nvfp4"],
         "floor_bf16_us": fl["bf16"], "floor_us": fl[fmt], "floor_bound": mb.floor_bound(lay, t, touched, CEIL, fmt),
         "status": status}
    if status == "ok":
        r.update({"median_us": us, "ratio": us / fl[fmt]})
    return r


def _synthetic_rows():
    rows = []
    for t, peer, w4a4 in [(1, 342.0, 40.0), (8, 1902.0, 800.0), (64, 7120.0, 2000.0), (512, 9000.0, 11000.0),
                          (4096, 40000.0, 60000.0)]:
        rows += [_row("deepseek-v3", t, "uniform", "peer", peer), _row("deepseek-v3", t, "uniform", "nvfp4", w4a4),
                 _row("deepseek-v3", t, "uniform", "bf16", 0.0, status="error: NotImplementedError: not yet")]
    rows.append(_row("mixtral", 8, "zipf", "peer", 1040.0, touched=8))
    rows.append(_row("mixtral", 8, "zipf", "nvfp4", 300.0, touched=8))
    rows.append(_row("mixtral", 8, "zipf", "bf16", 350.0, touched=8))
    # an older run of one case, and a later failed one: the latest ok row must win
    rows.append(_row("mixtral", 8, "zipf", "nvfp4", 999.0, run="20261130T000000Z-synth", touched=8))
    rows.append(_row("mixtral", 8, "zipf", "nvfp4", 1.0, run="20261202T000000Z-synth", status="wrong: rel_err 1",
                     touched=8))
    return pd.DataFrame(rows)


def test_report_with_no_rows_says_so():
    empty = pd.DataFrame()
    assert not len(mr.latest_moe(empty)) and not len(mr.targets(mr.latest_moe(empty)))
    assert "No H100 run" in mr.NO_DATA and mr.RECORD_COMMAND in mr.NO_DATA


def test_report_picks_latest_ok_rows_and_tabulates():
    rows = _synthetic_rows()
    assert set(rows["host"]) == {SYNTH}
    latest = mr.latest_moe(rows)
    assert list(dict.fromkeys(latest["layer"])) == ["deepseek-v3", "mixtral"]
    mx = latest[(latest["layer"] == "mixtral") & (latest["label"] == mr.W4A4)]
    assert list(mx["median_us"]) == [300.0]  # the latest ok row, not the older one nor the later wrong one
    tt = mr.time_table(latest)
    assert tt.loc[("deepseek-v3", 1, "uniform"), f"{mr.W4A4} speed-up vs peer"] == pytest.approx(342 / 40)
    assert math.isnan(tt.loc[("deepseek-v3", 1, "uniform"), f"{mr.W4A16} us"])
    mem = mr.memory_table(latest)
    ds = mb.get_layer("deepseek-v3")
    assert mem.loc[("deepseek-v3", mr.PEER), "weight GB"] == pytest.approx(ds.weight_bytes("bf16") / 1e9)
    assert mem.loc[("deepseek-v3", mr.W4A4), "held / NVFP4 weight bytes"] == pytest.approx(2.0)
    bad = mr.not_ok(rows)
    # W4A16 never ran; the later wrong W4A4 row of mixtral is reported though an earlier ok row is tabulated
    assert list(zip(bad["layer"], bad["label"], bad["cases"])) == [("deepseek-v3", mr.W4A16, 5),
                                                                    ("mixtral", mr.W4A4, 1)]
    assert len(mr.runs_used(latest)) == 1


def test_eager_table_sets_eager_beside_graph_where_rows_have_it():
    rows = _synthetic_rows()
    assert math.isnan(mr.eager_table(mr.latest_moe(rows)).iloc[0][f"{mr.W4A4} eager us"])  # no eager fields at all
    rows["eager_per_call_us"] = rows["median_us"] * 1.5
    rows["eager_b2b_us"] = rows["median_us"] * 1.2
    et = mr.eager_table(mr.latest_moe(rows))
    assert et.loc[("deepseek-v3", 8, "uniform"), f"{mr.W4A4} eager us"] == pytest.approx(1200.0)
    assert et.loc[("deepseek-v3", 8, "uniform"), f"{mr.PEER} eager / graph"] == pytest.approx(1.5)
    assert et.loc[("mixtral", 8, "zipf"), f"{mr.W4A16} eager back to back us"] == pytest.approx(420.0)
    assert math.isnan(et.loc[("deepseek-v3", 8, "uniform"), f"{mr.W4A16} eager us"])  # that mode never ran


def test_targets_hold_and_miss_as_issue_21_states_them():
    tg = mr.targets(mr.latest_moe(_synthetic_rows()))
    v = tg.set_index(["layer", "T", "routing", "mode", "target"])["verdict"]
    dec, flo = "decode: >= 2.5x faster than the bf16 peer", "decode: <= 1.5x the NVFP4 floor"
    pre4, pre16 = "prefill: within 1.3x the bf16 peer", "prefill: no slower than the bf16 peer"
    assert v["deepseek-v3", 1, "uniform", mr.W4A4, dec] == "holds"  # 40 <= 342 / 2.5
    assert ("deepseek-v3", 1, "uniform", mr.W4A4, flo) not in v.index  # the floor target starts at T = 8
    assert v["deepseek-v3", 8, "uniform", mr.W4A4, dec] == "misses"  # 800 > 1902 / 2.5 = 760.8
    assert v["deepseek-v3", 64, "uniform", mr.W4A4, dec] == "holds"  # 2000 <= 2848
    ds = mb.get_layer("deepseek-v3")
    floor64 = mb.moe_floor_us(ds, 64, 256, CEIL)
    assert v["deepseek-v3", 64, "uniform", mr.W4A4, flo] == ("holds" if 2000 <= 1.5 * floor64 else "misses")
    assert v["deepseek-v3", 8, "uniform", mr.W4A16, dec] == "no data"  # W4A16 has no ok row
    assert v["deepseek-v3", 512, "uniform", mr.W4A4, pre4] == "holds"  # 11000 <= 1.3 x 9000
    assert v["deepseek-v3", 4096, "uniform", mr.W4A4, pre4] == "misses"  # 60000 > 52000
    assert v["deepseek-v3", 512, "uniform", mr.W4A16, pre16] == "no data"
    assert v["mixtral", 8, "zipf", mr.W4A4, dec] == "holds"  # 300 <= 1040 / 2.5
    assert v["mixtral", 8, "zipf", mr.W4A16, dec] == "holds"  # 350 <= 416
    s = mr.target_summary(tg)
    assert s.loc[(dec, mr.W4A4), "holds"] + s.loc[(dec, mr.W4A4), "misses"] == 4


def test_time_figure_draws_every_layer(tmp_path):
    import matplotlib.pyplot as plt

    fig = mr.time_figure(mr.latest_moe(_synthetic_rows()), source="synthetic rows (test)")
    assert len(fig.axes) == 2
    fig.savefig(tmp_path / "f.png")
    plt.close(fig)


def test_predicted_floors_before_any_measurement():
    p = mr.predicted_floors()
    assert mr.expected_touched(8, 2, 1) == pytest.approx(2.0)
    assert mr.expected_touched(256, 8, 4096) == pytest.approx(256.0)
    ds1 = p.loc[("deepseek-v3", 1)]
    ds = mb.get_layer("deepseek-v3")
    assert ds1["bf16 floor / NVFP4 floor"] == pytest.approx(ds.expert_bytes("bf16") / ds.expert_bytes("nvfp4"))
    assert ds1["NVFP4 floor bound"] == "memory" and p.loc[("mixtral", 4096), "NVFP4 floor bound"] == "compute"
    assert p.loc[("deepseek-v3", 4096), "bf16 floor bound"] == "memory"  # 22.5 GB at 3.35 TB/s: 6.7 ms


def test_runs_used_says_when_the_tree_state_is_unknown():
    from nvfp4lib.bench.store import dirty_state

    assert [dirty_state(v) for v in (None, float("nan"), True, False)] == ["unknown", "unknown", "yes", "no"]
    rows = _synthetic_rows()
    rows["git_dirty"] = None  # as the GPU machine records it: the commit given, the tree unread
    assert set(mr.runs_used(mr.latest_moe(rows))["dirty tree"]) == {"unknown"}


# --- the notebook's answer at one commit, and its rounds (synthetic rows) -----------------------------------------

MX8 = mr.grid(layers=["mixtral"], tokens=[8], routings=["zipf"])  # the synthetic rows' one complete case


def test_verdict_rests_on_the_latest_commit_that_covers_the_grid():
    rows = _synthetic_rows()
    # a newer run at another commit measures only the peer: not complete, so not the verdict, but named as newer
    newer = _row("mixtral", 8, "zipf", "peer", 900.0, run="20261203T000000Z-synth", touched=8, commit="1111111synth")
    rows = pd.concat([rows, pd.DataFrame([newer])], ignore_index=True)
    v = mr.verdict(rows, cases=MX8)
    assert v.short == "0000000" and v.missing == 0
    assert list(v.newer["run_id"]) == ["20261203T000000Z-synth"] and list(v.newer["commit"]) == ["1111111"]
    assert float(v.latest[(v.latest["layer"] == "mixtral") & (v.latest["label"] == mr.PEER)]["median_us"].iloc[0]) \
        == 1040.0  # the newer commit's row is not mixed in
    lines = mr.verdict_lines(v, mr.targets(v.latest))
    assert "commit 0000000" in lines[0] and any("1111111" in x for x in lines)
    # no commit covers the default grid: the latest commit, with its gaps counted
    w = mr.verdict(rows)
    assert w.short == "1111111" and w.missing == len(mr.grid()) - 1
    assert mr.verdict(pd.DataFrame()) is None and mr.verdict_lines(None, pd.DataFrame()) == [mr.NO_DATA]


def test_shown_tables_carry_no_nan():
    rows = _synthetic_rows()
    rows["eager_per_call_us"] = rows["median_us"] * 1.5
    latest = mr.latest_moe(rows)
    tg = mr.targets(latest)
    for df in (mr.answer_table(latest, tg), mr.regime_table(latest, tg), mr.mode_table(latest),
               mr.eager_summary(latest), mr.miss_table(latest, tg), mr.target_summary(tg), mr.layers_table()):
        assert len(df)
        out = mr.shown(df)
        assert not out.isna().any().any()
        assert "nan" not in out.to_string().lower()
    ans = mr.shown(mr.answer_table(latest, tg))
    assert ans.loc[("deepseek-v3", 1, "uniform"), "W4A16 us"] == "—"  # W4A16 never ran
    assert ans.loc[("deepseek-v3", 8, "uniform"), "W4A4 us"] == 800
    assert "W4A4 decode: 2.5x faster than bf16" in ans.loc[("deepseek-v3", 8, "uniform"), "missed"]
    assert ans.loc[("mixtral", 8, "zipf"), "missed"] == "none"


def test_miss_table_names_each_miss_and_its_signals():
    latest = mr.latest_moe(_synthetic_rows())
    tg = mr.targets(latest)
    mt = mr.miss_table(latest, tg)
    assert len(mt) == int((tg["verdict"] == "misses").sum())
    dec = mt.loc[("deepseek-v3", 8, "uniform", "W4A4", "decode: 2.5x faster than bf16")]
    assert dec["measured / limit"] == pytest.approx(800 / (1902 / 2.5))
    assert dec["copies per expert"] == pytest.approx(8 * 8 / 64)
    assert "fixed costs" in dec["signals"]
    pre = mt.loc[("deepseek-v3", 4096, "uniform", "W4A4", "prefill: within 1.3x of bf16")]
    assert pre["bound"] == "compute" and pre["signals"].startswith("compute-bound")


def test_rounds_table_computes_outcomes_from_rows_and_says_what_is_not_recorded():
    assert set(moe_rounds.rounds_table(pd.DataFrame())["outcome (from data/moe.jsonl)"].str[:21]) == \
        {moe_rounds.NOT_RECORDED}
    rows = []
    for commit, run, w4a4 in (("a29692e", "20261101T000000Z-a", 300.0), ("5467d03", "20261102T000000Z-b", 130.0)):
        for t in (1, 8):
            rows += [_row("deepseek-v3", t, "uniform", "nvfp4", w4a4 * t, run=run, commit=commit),
                     _row("deepseek-v3", t, "uniform", "bf16", 120.0 * t, run=run, commit=commit),
                     _row("deepseek-v3", t, "uniform", "peer", 400.0 * t, run=run, commit=commit)]
    rows.append(_row("qwen3-moe", 1, "uniform", "peer", 70.0, run="20261103T000000Z-c", commit="fffffffsynth"))
    t = moe_rounds.rounds_table(pd.DataFrame(rows))
    quant = t[t["commit"] == "5467d03"].iloc[0]
    assert quant["prediction"].startswith("W4A4 at T <= 64")
    # W4A4 - W4A16 at 5467d03: 130 - 120 = +10 (T = 1) and 1040 - 960 = +80 (T = 8); at a29692e +180, +1440
    assert "+10.0 to +80.0 us at 5467d03 (at a29692e: +180.0 to +1,440.0 us)" in quant["outcome (from data/moe.jsonl)"]
    assert quant["runs"] == "20261102T000000Z-b"
    first = t[t["commit"] == "b3d663e"].iloc[0]
    assert first["outcome (from data/moe.jsonl)"] == moe_rounds.NOT_RECORDED and "datasheet" in first["prediction"]
    gen = t.iloc[-1]  # a commit no round names gets a generated line
    assert gen["commit"] == "fffffff" and gen["prediction"] == moe_rounds.NO_PREDICTION


def test_the_quantizer_knob_is_set_for_the_run_only():
    """moe-bench --quant-one-program: the knob is set inside the run and restored after it, also on an error."""
    pytest.importorskip("triton")
    from nvfp4lib.nn import quant_triton

    shipped = quant_triton.ONE_PROGRAM
    for value in (True, False):
        with mb.knob_setting(*mb.QUANT_KNOB, value):
            assert quant_triton.ONE_PROGRAM is value
        assert quant_triton.ONE_PROGRAM is shipped
    with pytest.raises(RuntimeError), mb.knob_setting(*mb.QUANT_KNOB, not shipped):
        raise RuntimeError("a failed run")
    assert quant_triton.ONE_PROGRAM is shipped
    with mb.knob_setting(*mb.QUANT_KNOB, None):
        assert quant_triton.ONE_PROGRAM is shipped


def test_each_ab_arm_sets_its_knobs_around_its_run_and_restores_them(monkeypatch):
    """moe-bench's A/B options (mb.AB_OPTIONS): one run of the set per value, in the order given, with that value's
    knobs set while it runs — module knobs as converted, build knobs by their recipe fields (the on/off ones as the
    bools the modules hold: the recipes of kernels built ahead of time hold bools), --chain-pdl's two knobs — and
    every knob as before after the run; values passed to bench_moe (--split-k, --input-scales) reach it."""
    import argparse

    from nvfp4lib.kernels.common import pdl
    from nvfp4lib.kernels.hopper_varlen import config, runner
    from nvfp4lib.nn import moe, routing

    assert len({o.flag for o in mb.AB_OPTIONS}) == len(mb.AB_OPTIONS)
    before = (runner.build_knobs(), moe.COMBINE_IN_GEMM, routing.ROUTE_GATHER, pdl.CHAIN, pdl.CHAIN_GEMM,
              config.PAIR_MIN_K_TILES)
    seen = []

    def fake_bench(*a, **k):
        seen.append((runner.build_knobs(), moe.COMBINE_IN_GEMM, routing.ROUTE_GATHER, pdl.CHAIN, pdl.CHAIN_GEMM,
                     config.PAIR_MIN_K_TILES, k["split_k"], k["static_scales"]))
        return []

    monkeypatch.setattr(mb.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mb, "bench_moe", fake_bench)
    parser = argparse.ArgumentParser()
    mb.add_command(parser.add_subparsers(), lambda p, *a: None, lambda *a: None)
    args = parser.parse_args(["moe-bench", "--combine-in-gemm", "1", "0", "--prewait-stages", "0", "--tile-handoff",
                              "0", "--route-gather", "0", "--chain-pdl", "gemm", "--pair-min-k-tiles", "8",
                              "--split-k", "idle", "--input-scales", "static"])
    assert args.fn(args) == 0 and len(seen) == 2
    for (build, combine, gather, chain, chain_gemm, pair, split, static), want in zip(seen, (True, False)):
        assert combine is want and gather is False and (chain, chain_gemm) == (True, True) and pair == 8
        assert build["prewait"] == 0 and build["handoff"] is False and split == "idle" and static is True
    assert (runner.build_knobs(), moe.COMBINE_IN_GEMM, routing.ROUTE_GATHER, pdl.CHAIN, pdl.CHAIN_GEMM,
            config.PAIR_MIN_K_TILES) == before


def test_issue_41_targets_on_the_latest_shipped_rows():
    rows = [_row("qwen3-moe", 1, "uniform", "peer", 60.0), _row("qwen3-moe", 1, "uniform", "nvfp4", 41.0),
            _row("qwen3-moe", 1, "uniform", "bf16", 19.0),
            # a knob A/B's other arm, later: left out (the shipped row above stays the case's latest)
            dict(_row("qwen3-moe", 1, "uniform", "nvfp4", 5.0, run="20261202T000000Z-synth"), quant_one_program=True),
            # another card: left out
            dict(_row("qwen3-moe", 1, "uniform", "bf16", 50.0, run="20261203T000000Z-synth"), gpu="NVIDIA H200"),
            # the operand A/B's codes arm, later: left out
            dict(_row("qwen3-moe", 1, "uniform", "nvfp4", 6.0, run="20261204T000000Z-synth"), quant_operand=False),
            # static activation scales, later: left out (the targets are per-call scales')
            dict(_row("qwen3-moe", 1, "uniform", "nvfp4", 7.0, run="20261205T000000Z-synth"), input_scales="static"),
            _row("deepseek-v3", 4096, "uniform", "peer", 40000.0), _row("deepseek-v3", 4096, "uniform", "nvfp4",
                                                                         30000.0)]
    rows = pd.DataFrame(rows)
    assert len(mr.shipped_rows(rows)) == 5
    tg = mr.targets_41(rows)
    v = tg.set_index(["layer", "T", "mode", "target"])["verdict"]
    t1 = f"Qwen3-like T=1: <= {mr.ISSUE41_T1_US:g} us"
    assert v["qwen3-moe", 1, mr.W4A4, t1] == "misses" and v["qwen3-moe", 1, mr.W4A16, t1] == "holds"
    qw = mb.get_layer("qwen3-moe")
    floor = mb.moe_floor_us(qw, 1, 8, CEIL)
    assert v["qwen3-moe", 1, mr.W4A16, "decode: <= 2x the NVFP4 floor"] == ("holds" if 19.0 <= 2 * floor
                                                                            else "misses")
    assert v["deepseek-v3", 4096, mr.W4A4, "prefill: no slower than the bf16 layer"] == "holds"
    assert v["deepseek-v3", 4096, mr.W4A16, "prefill: no slower than the bf16 layer"] == "no data"
    ds_floor = mb.moe_floor_us(mb.get_layer("deepseek-v3"), 4096, 256, CEIL)
    compute = [t for t in v.index.get_level_values("target") if t.startswith("prefill: <= 1.2x")]
    assert compute and v["deepseek-v3", 4096, mr.W4A4, compute[0]] == ("holds" if 30000 <= 1.2 * ds_floor
                                                                         else "misses")
    assert set(tg.loc[tg["verdict"] != "no data", "commit"]) == {"0000000"}  # a case without a row has none


def test_wide_decode_round_counts_the_wrong_cases_of_its_third_arm():
    """The wide decode form's round: off -> the shipped rule's times, and the 'all' arm's wrong cases counted from
    every row (the Reader's ok rows alone would hide them); no rows at its commit, no outcome."""
    c, run = moe_runs.WIDE_COMMIT + "synthetic", "20261128T090000Z-synth"
    rows = [dict(_row("qwen3-moe", 1, "uniform", "bf16", us, run=run, commit=c), wide_decode=arm)
            for arm, us in (("off", 28.0), ("idle", 32.0), ("all", 31.0))]
    rows += [dict(_row("mixtral", 1, "uniform", "bf16", 100.0, run=run, commit=c), wide_decode="off"),
             dict(_row("mixtral", 1, "uniform", "bf16", 0, run=run, commit=c, status="wrong: rel_err 1e+34 > 0.01"),
                  wide_decode="all")]
    text = moe_rounds._wide_ab(moe_rounds.Reader(pd.DataFrame(rows)))
    assert "qwen3-moe T = 1 W4A16 28.0 -> 32.0 us" in text
    assert "1 of 2 cases wrong (mixtral T = 1 W4A16)" in text and "1.11x the narrow form's time" in text
    assert moe_rounds._wide_ab(moe_rounds.Reader(pd.DataFrame(rows[:1]).assign(git_commit="0000000"))) is None


def test_operand_shipped_round_reads_the_ab_runs_apart_from_the_shipped_run():
    """The QUANT_TO_OPERAND shipped round: the Mixtral-like A/B's runs (that layer alone) give both arms per routing;
    the shipped run (every layer) gives the Qwen3-like T = 1 times; no rows at its commit, no outcome."""
    c = moe_runs.OPERAND_COMMITS[2] + "synthetic"
    ab = [dict(_row("mixtral", 1, routing, "nvfp4", us, run=run, commit=c), quant_operand=on)
          for routing in ("uniform", "zipf") for on, us, run in ((False, 112.0, "20261128T120000Z-a"),
                                                                  (True, 107.0, "20261128T120100Z-b"))]
    ship = [dict(_row(layer, 1, "uniform", "nvfp4", us, run="20261128T120200Z-c", commit=c), quant_operand=True)
            for layer, us in (("qwen3-moe", 29.0), ("mixtral", 108.0))]
    text = moe_rounds._operand_shipped(moe_rounds.Reader(pd.DataFrame(ab + ship)))
    assert "uniform off 112.0 us, uniform on 107.0 us, zipf off 112.0 us, zipf on 107.0 us" in text
    assert "Qwen3-like T = 1: W4A4 uniform 29.0 us" in text
    assert moe_rounds._operand_shipped(moe_rounds.Reader(pd.DataFrame(ab).assign(git_commit="0000000"))) is None


def test_prefetch_round_lists_the_arms_in_the_order_they_ran():
    """The L2 prefetch's round (moe-bench --prefetch-l2 off on off on): per case, each arm's time in run order; no
    rows at its commit, no outcome."""
    c = moe_runs.PREFETCH_COMMIT + "synthetic"
    rows = [dict(_row("qwen3-moe", 1, "uniform", "bf16", us, run=f"20261128T14{i:02d}00Z-s", commit=c), prefetch_l2=on)
            for i, (on, us) in enumerate(((False, 26.9), (True, 30.3), (False, 28.2), (True, 30.1)))]
    text = moe_rounds._prefetch_ab(moe_rounds.Reader(pd.DataFrame(rows)))
    assert "qwen3-moe T = 1 uniform W4A16: off 26.9 then on 30.3 then off 28.2 then on 30.1 us" in text
    assert moe_rounds._prefetch_ab(moe_rounds.Reader(pd.DataFrame(rows).assign(git_commit="0000000"))) is None


def test_prewait_round_keeps_the_timeline_probe_apart_from_the_timed_rows():
    """The first PREWAIT_STAGES round: the A/B from the timed rows only (the probe's rows, later in the same commit,
    do not replace them), then the probe's phases per value; the shipped round compares each mode with the run
    before."""
    c = moe_runs.PREWAIT_COMMITS[0] + "synthetic"
    timed = [dict(_row("qwen3-moe", 8, "uniform", "bf16", us, run=run, commit=c), prewait_stages=v)
             for v, us, run in ((0, 81.2, "20261128T140000Z-a"), (2, 75.5, "20261128T140100Z-b"))]
    phases = {"schedule": [1.0], "wait": [0.4], "first stage": [1.1], "mainloop": [7.0], "epilogue": [0.4],
              "total": [9.9]}
    probe = [dict(_row("qwen3-moe", 8, "uniform", "bf16", 99.0, run="20261128T140200Z-c", commit=c), prewait_stages=2,
                  timeline={"gate_up": {"tiles": 96, "phases": phases}})]
    text = moe_rounds._prewait_first(moe_rounds.Reader(pd.DataFrame(timed + probe)))
    assert "qwen3-moe T = 8 W4A16 81.2 -> 75.5 us" in text
    assert "2 stages before the wait, W4A16: gate_up schedule 1.00, wait 0.40, first stage 1.10" in text
    before, after = (moe_runs.OPERAND_COMMITS[2] + "synthetic", moe_runs.PREWAIT_COMMITS[2] + "synthetic")
    ship = [_row("qwen3-moe", 1, "uniform", kind, us, commit=cm) for cm, kind, us in
            ((before, "bf16", 27.1), (after, "bf16", 25.7), (before, "nvfp4", 29.1), (after, "nvfp4", 28.7))]
    text = moe_rounds._prewait_shipped(moe_rounds.Reader(pd.DataFrame(ship)))
    assert "W4A16 after / before 0.95 (1 of 1 faster)" in text and "W4A16 uniform 25.7 us (was 27.1)" in text


def test_prewait_eager_round_reads_eager_host_time_in_units_of_the_host_probe():
    """The eager re-measure's round: each arm in run order with its probe; the eager host time over the probe per
    arm (here equal: the slower eager calls ran on a slower host); the graph replays compared per case."""
    c = moe_runs.PREWAIT_EAGER_COMMIT + "synthetic"
    rows = [dict(_row("qwen3-moe", 1, "uniform", "bf16", us, run="20261128T155317Z-s", commit=c), prewait_stages=v,
                 eager_per_call_us=host, eager_host_us=host, host_probe_idle_us=probe)
            for v, us, host, probe in ((0, 27.3, 150.0, 30.0), (2, 26.4, 250.0, 50.0), (2, 26.8, 140.0, 28.0),
                                       (0, 28.6, 130.0, 26.0))]
    text = moe_rounds._prewait_eager(moe_rounds.Reader(pd.DataFrame(rows)))
    assert "qwen3-moe T = 1 W4A16: 0: 27.3 / 150 (probe 30), 2: 26.4 / 250 (probe 50)" in text
    assert "PREWAIT 0: mean 5.00, 5.00 over 2 rows; PREWAIT 2: mean 5.00, 5.00 over 2 rows" in text
    assert "2 faster in 1 of 1 cases" in text
    assert moe_rounds._prewait_eager(moe_rounds.Reader(pd.DataFrame(rows).assign(git_commit="0000000"))) is None


def test_shipped_rows_leave_out_the_prewait_and_prefetch_arms_not_shipped():
    """PREWAIT_STAGES shipped for W4A16 only: a W4A16 row asking for all first stages (0) is an A/B arm; a W4A4 row
    with some is one only where the knob also took W4A4 (its A/B commits); the L2 prefetch's 'on' arm is out."""
    ab, later = mr.PREWAIT_BOTH_MODES[0] + "synthetic", "1234567synthetic"
    rows = [dict(_row("qwen3-moe", 1, "uniform", kind, 30.0, commit=c), prewait_stages=pw)
            for c, kind, pw in ((ab, "bf16", 0), (ab, "bf16", 2), (ab, "nvfp4", 0), (ab, "nvfp4", 2),
                                (later, "nvfp4", 2), (later, "bf16", 2))]
    rows += [dict(_row("qwen3-moe", 1, "uniform", "bf16", 30.0, commit=later), prefetch_l2=on) for on in (False, True)]
    kept = mr.shipped_rows(pd.DataFrame(rows))
    got = sorted((c[:7] == ab[:7], lab, pw, pf) for c, lab, pw, pf in zip(
        kept["git_commit"], kept["mode"], kept["prewait_stages"].fillna(-1), kept["prefetch_l2"].fillna(-1)))
    assert got == [(False, "bf16", -1, False), (False, "bf16", 2, -1), (False, "nvfp4", 2, -1),
                   (True, "bf16", 2, -1), (True, "nvfp4", 0, -1)]


def test_shipped_rows_leave_out_the_once_wait_off_and_short_k_on_arms():
    """tuning.ONCE_WAIT shipped on, tuning.SHORT_K shipped off (0), tuning.DUAL_96 at its bucket: the other arms of
    their A/Bs are left out (of DUAL_96 also its first A/B's on/off rows); rows from before the knobs (no field)
    stay."""
    c = "1234567synthetic"
    rows = [dict(_row("mixtral", 512, "uniform", "nvfp4", us, commit=c), once_wait=ow, short_k=sk, dual_96=d)
            for us, ow, sk, d in ((1.0, True, 0, tuning.DUAL_96), (2.0, True, 4096, tuning.DUAL_96),
                                  (3.0, False, 0, tuning.DUAL_96), (4.0, None, None, None), (5.0, True, 0, 0),
                                  (6.0, True, 0, True), (7.0, True, 0, False))]
    kept = mr.shipped_rows(pd.DataFrame(rows))
    assert sorted(kept["median_us"]) == [1.0, 4.0]
