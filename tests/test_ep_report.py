"""Notebook 13's logic without a GPU: the published model configs and what fits where (computed, checked against the
model cards), and the verdict, targets, tables and figure on clearly synthetic rows (never written to data/)."""
import matplotlib
import pandas as pd
import pytest

from nvfp4lib.bench import ep_bench as eb
from nvfp4lib.bench import moe_bench as mb
from nvfp4lib.study import ep_report as er
from nvfp4lib.study.ep_models import MODELS, get_model

matplotlib.use("Agg")

SYNTHETIC_GPU = "SYNTHETIC GPU (test rows)"


def synthetic_rows(run_id="20990101T000000Z-synthetic", symm_combine=12.0, ag_combine=30.0, world=2):
    """Rows shaped as ep_bench writes them, with made-up times: symm-mem's dispatch + combine 27 us, all-gather's
    45 us; the peer's experts 3x slower; one GPU twice the EP step's experts."""
    rows = []
    base = {"run_id": run_id, "world": world, "gpu": SYNTHETIC_GPU, "gpus_ranks": [SYNTHETIC_GPU] * world,
            "git_commit": "0" * 40, "git_dirty": False, "date": "2099-01-01T00:00:00+00:00", "graph": True,
            "routing": "uniform", "status": "ok", "smi_clocks_sm": "1980", "smi_clocks_max_sm": "1980",
            "smi_driver_version": "0"}
    for layer in mb.EP_LAYERS:
        for t in mb.EP_TOKENS:
            scale = 1 + t / 64
            for kind in ("nvfp4", "bf16"):
                rows.append({**base, "form": "single", "layer": layer, "tokens": t, "kind": kind, "transport": None,
                             "single_us": 160.0 * scale, "median_us": 160.0 * scale, "tol": eb.TOL[kind],
                             "rel_err": 0.0})
            for tr in mb.EP_TRANSPORTS:
                for kind in ("nvfp4", "bf16", "peer"):
                    d, e = 15.0, 40.0 * scale * (3.0 if kind == "peer" else 1.0)
                    c = symm_combine if tr == "symm-mem" else ag_combine
                    rows.append({**base, "form": "ep", "layer": layer, "tokens": t, "kind": kind, "transport": tr,
                                 "dispatch_us": d, "experts_us": e, "transport_us": d + c, "combine_us": c,
                                 "step_us": d + e + c + 2, "median_us": d + e + c + 2, "overlap_us": 2.0,
                                 "rel_err": 1e-3, "bit_identical": False, "tol": eb.TOL[kind]})
    return pd.DataFrame(rows)


# --- published configs ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m", MODELS, ids=[m.name for m in MODELS])
def test_computed_parameters_match_the_model_cards(m):
    assert m.total_params() / 1e9 == pytest.approx(m.published_b, rel=0.005)
    assert m.source.startswith("https://huggingface.co/") and "config.json" in m.source


def test_expert_bytes_match_the_issue_and_the_bench_layers():
    ds, qw = get_model("DeepSeek-V3"), get_model("Qwen3-235B")
    # the issue: DeepSeek-V3/R1's experts alone ~380 GB in NVFP4, Qwen3-235B-A22B's ~120 GB
    assert er.nvfp4_bytes(ds)["experts"] / 1e9 == pytest.approx(368, abs=2)
    assert er.nvfp4_bytes(qw)["experts"] / 1e9 == pytest.approx(128, abs=2)
    # one DeepSeek-V3 MoE layer's experts are the bench's deepseek-v3 layer
    assert er.nvfp4_bytes(ds)["experts"] == ds.moe_layers * mb.get_layer("deepseek-v3").weight_bytes("nvfp4")
    assert er.nvfp4_bytes(ds, "bf16")["experts"] / er.nvfp4_bytes(ds)["experts"] == pytest.approx(3.56, abs=0.01)
    # MLA caches 576 values per layer and token; GQA a key and a value per KV head
    assert ds.kv_bytes_per_token() == 61 * 576 * 2
    assert qw.kv_bytes_per_token() == 94 * 2 * 4 * 128 * 2


def test_fit_table_is_the_smallest_divisor_that_fits():
    ft = er.fit_table()
    h100, h200 = (f"{k}: GPUs (NVFP4)" for k in er.GPUS)
    assert ft.loc["DeepSeek-V3 / R1", h100] == 16 and ft.loc["DeepSeek-V3 / R1", h200] == 8
    assert ft.loc["Qwen3-235B-A22B", h100] == 4 and ft.loc["Qwen3-235B-A22B", h200] == 2
    assert ft.loc["Qwen3-30B-A3B", h100] == 1 and ft.loc["Mixtral-8x7B", h100] == 1
    assert ft.loc["Mixtral-8x22B", h100] == 2 and ft.loc["Mixtral-8x22B", h200] == 1
    for m in MODELS:
        for cap in er.GPUS.values():
            g, per = er.gpus_needed(m, cap)
            assert per <= (1 - er.RESERVE) * cap and m.experts % g == 0
            smaller = [x for x in er.EP_SIZES if x < g and m.experts % x == 0]
            for x in smaller:  # no smaller EP size fits
                b = er.nvfp4_bytes(m)
                assert b["experts"] / x + b["rest"] > (1 - er.RESERVE) * cap
    # bf16 experts need more GPUs, never fewer
    for m in MODELS:
        for name in er.GPUS:
            assert ft.loc[m.name, f"{name}: GPUs (bf16 experts)"] >= ft.loc[m.name, f"{name}: GPUs (NVFP4)"]
    # a model whose replicated rest cannot fit: no EP size
    assert er.gpus_needed(get_model("DeepSeek-V3"), 30e9) == (None, er.nvfp4_bytes(get_model("DeepSeek-V3"))["rest"])
    er.fit_figure()


# --- the measured part on synthetic rows ------------------------------------------------------------------------------

def test_no_gpu_rows_means_no_verdict():
    assert er.verdict(pd.DataFrame()) is None
    cpu = synthetic_rows().assign(gpu="none (CPU)")  # the CPU tests' rows never count
    assert er.verdict(cpu) is None
    assert er.verdict(synthetic_rows(world=1)) is None
    assert er.verdict_lines(None, er.targets(pd.DataFrame()))[0] == er.NO_DATA


def test_targets_on_synthetic_rows():
    rows = pd.concat([synthetic_rows("20980101T000000Z-older", symm_combine=99.0), synthetic_rows()])
    v = er.verdict(rows)
    assert v.run_ids == ("20990101T000000Z-synthetic",) and v.older_runs == 1
    tg = er.targets(v.latest)
    n_modes, n_tr, n_layers = 2, 2, 2
    decode = [t for t in mb.EP_TOKENS if t <= er.DECODE_MAX_T]
    by = tg.groupby("target")["verdict"]
    assert len(tg) == n_modes * n_tr * n_layers * (len(mb.EP_TOKENS) + 2 * len(decode) + 1)
    exact = tg[tg["target"].str.startswith("exact")]
    assert (exact["verdict"] == "holds").all()
    tc = tg[tg["target"].str.contains("dispatch \\+ combine")]
    assert (tc[tc["transport"] == "symm-mem"]["verdict"] == "holds").all()  # 27 us
    assert (tc[tc["transport"] == "all-gather"]["verdict"] == "misses").all()  # 45 us
    assert set(tc["measured"]) == {27.0, 45.0}
    thr = tg[tg["target"].str.contains("throughput")]
    assert (thr["verdict"] == "holds").all() and (thr["T"] == er.PREFILL_T).all()
    peer = tg[tg["target"].str.contains("peer")]
    one = peer[(peer["layer"] == "qwen3-moe") & (peer["T"] == 1) & (peer["transport"] == "symm-mem")].iloc[0]
    assert one["measured"] == pytest.approx((15 + 3 * 40 * (1 + 1 / 64) + 12 + 2) / (15 + 40 * (1 + 1 / 64) + 12 + 2))
    assert by.count().sum() == len(tg)
    lines = er.verdict_lines(v, tg)
    assert "2 ranks on SYNTHETIC GPU" in lines[0] and "checks hold" in lines[1]
    summary = er.target_summary(tg)
    assert summary["holds"].sum() + summary["misses"].sum() + summary["no data"].sum() == len(tg)


def test_each_miss_says_why_in_numbers():
    rows = synthetic_rows()
    slow_one = (rows["form"] == "single") & (rows["tokens"] == er.PREFILL_T) & (rows["layer"] == "qwen3-moe")
    rows.loc[slow_one, ["single_us", "median_us"]] = 4000.0
    tg = er.targets(er.verdict(rows).latest)
    mt = er.miss_table(er.verdict(rows).latest, tg)
    assert len(mt) == (tg["verdict"] == "misses").sum() > 0
    tc = mt[mt["target"].str.contains("dispatch \\+ combine")]
    assert len(tc) and tc["reason"].str.endswith("without any quantization too").all()  # W4A16 and the peer: 45 us
    thr = mt[mt["target"].str.contains("throughput") & (mt["transport"] == "all-gather")]
    step = 15 + 40 * (1 + er.PREFILL_T / 64) + 30 + 2
    assert thr["ceiling"].tolist() == pytest.approx([4000 / (step - 45)] * 2)
    assert thr["reason"].str.endswith("the experts miss too").all()
    peer = mt[mt["target"].str.contains("peer") & (mt["T"] == 1) & (mt["transport"] == "all-gather")]
    peer_step = 15 + 3 * 40 * (1 + 1 / 64) + 30 + 2
    assert peer["ceiling"].tolist() == pytest.approx([peer_step / 45] * len(peer)) and len(peer)
    assert peer["reason"].str.endswith("the experts are the gap").all()
    assert not len(er.miss_table(er.verdict(synthetic_rows()).latest, tg[tg["verdict"] == "holds"]))


def test_a_missing_peer_or_single_row_is_no_data_not_a_verdict():
    rows = synthetic_rows()
    rows = rows[~((rows["kind"] == "peer") & (rows["transport"] == "all-gather"))]
    rows = rows[~(rows["form"] == "single")]
    tg = er.targets(er.verdict(rows).latest)
    gone = tg[tg["target"].str.contains("peer|throughput")]
    assert set(gone[gone["transport"] == "all-gather"]["verdict"]) == {"no data"}
    assert set(gone[gone["target"].str.contains("throughput")]["verdict"]) == {"no data"}


def test_phase_table_and_figure():
    v = er.verdict(synthetic_rows())
    pt = er.phase_table(v.latest)
    assert len(pt) == 2 * len(mb.EP_TOKENS) * 2 * 3
    r = pt.loc[("qwen3-moe", 4096, "symm-mem", "W4A4")]
    assert r["one GPU / EP"] == pytest.approx(160 * 65 / (15 + 40 * 65 + 12 + 2))
    assert pd.isna(pt.loc[("qwen3-moe", 4096, "symm-mem", "bf16 peer")]["one GPU us"])
    shown = er.shown(pt)
    assert not shown.isna().any().any()
    er.phase_figure(v.latest)


def test_a_run_of_one_size_keeps_the_other_sizes_latest_rows():
    """A later run that timed only T=4096 answers for T=4096; every other size keeps its own latest run."""
    old = synthetic_rows("20980101T000000Z-all")
    new = synthetic_rows("20990101T000000Z-prefill", symm_combine=5.0)
    new = new[new["tokens"] == er.PREFILL_T]
    v = er.verdict(pd.concat([old, new]))
    assert v.run_ids == ("20980101T000000Z-all", "20990101T000000Z-prefill") and v.older_runs == 0
    by_t = v.latest.groupby("tokens")["run_id"].unique()
    assert list(by_t[er.PREFILL_T]) == ["20990101T000000Z-prefill"]
    assert all(list(by_t[t]) == ["20980101T000000Z-all"] for t in by_t.index if t != er.PREFILL_T)
    lines = er.verdict_lines(v, er.targets(v.latest))
    assert lines[0].startswith("Verdict from run 20980101T000000Z-all") and "T=4096" in lines[1]


def test_a_knob_ab_run_of_one_mode_keeps_the_verdict_run_and_shows_its_ab():
    """A later A/B of a knob in W4A4 alone (one run per setting) does not displace the run of both modes; knob_table
    sets the two settings side by side."""
    full = synthetic_rows("20980101T000000Z-all")
    ab = []
    for i, (value, dispatch) in enumerate(((257, 60.0), (32, 45.0))):
        r = synthetic_rows(f"2099010{i + 1}T000000Z-ab", ag_combine=20.0)
        r = r[(r["kind"] == "nvfp4") & (r["tokens"] == 64) & (r["transport"] == "all-gather")]
        ab.append(r.assign(dispatch_us=dispatch, gather_quantize_once_min_tokens=value))
    rows = pd.concat([full, *ab])
    v = er.verdict(rows)
    assert v.run_ids == ("20980101T000000Z-all",) and v.older_runs == 2
    t = er.knob_table(rows, "gather_quantize_once_min_tokens", (257, 32))
    assert len(t) == len(mb.EP_LAYERS)
    assert (t["dispatch 32 / 257"] == 0.75).all() and (t["experts 32 / 257"] == 1.0).all()
    assert not len(er.knob_table(full, "gather_quantize_once_min_tokens", (257, 32)))  # no field: nothing to show
    # a one-mode run is still the verdict where no run holds both modes
    only = er.verdict(pd.concat(ab))
    assert only.run_ids == ("20990102T000000Z-ab",)
