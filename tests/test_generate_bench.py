"""generate-bench without a GPU: the tiny preset end to end on the CPU (reference backend, no CUDA graphs) into a
temporary rows file (each row appended as it is made), a model kind that fails beside one that works, a stop and a
time budget that keep the rows measured so far and say why the others are missing, the priority order, the bf16
models' weights against the NVFP4 checkpoint's, and notebook 12's report on the tiny run's rows (relabelled as a GPU
run's in memory, never written to data/)."""
import json

import pytest
import torch

# a module fixture shared by this file's tests: they run in one pytest-xdist worker, so it is built once
pytestmark = pytest.mark.xdist_group("test_generate_bench")

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import pandas as pd  # noqa: E402

from nvfp4lib.bench import generate_bench as gb  # noqa: E402
from nvfp4lib.study import generate_report as gr  # noqa: E402
from nvfp4lib.study.cli import main  # noqa: E402

TINY = dict(preset="tiny", batches=(1, 2), new_tokens=8, device="cpu", progress=None)


@pytest.fixture(scope="module")
def cli_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("generate") / "generate.jsonl"
    rc = main(["generate-bench", "--preset", "tiny", "--format", "modelopt", "--batch", "1", "2", "--new-tokens", "8",
               "--device", "cpu", "--out", str(out), "--no-record"])
    return rc, [json.loads(line) for line in out.read_text().splitlines()]


def test_the_tiny_preset_runs_end_to_end(cli_rows):
    rc, rows = cli_rows
    assert rc == 0
    got = {(r["model_kind"], r["activations"], r["loop"], r["cuda_graph"], r["batch"]) for r in rows}
    want = {(k, a, gb.STATIC, False, b) for k, a in (("nvfp4", "nvfp4"), ("nvfp4", "bf16"), ("bf16-peer", "bf16"),
                                                     ("transformers-bf16", "bf16")) for b in (1, 2)}
    want |= {("transformers-bf16", "bf16", gb.HF_GENERATE, False, b) for b in (1, 2)}
    assert got == want and len(rows) == len(want)  # --out holds each row once: appended as made, not again at the end
    assert len({r["run_id"] for r in rows}) == 1
    # priority order: the bf16 peer (the reference), the NVFP4 models, transformers' model last
    assert [r["label"] for r in rows[::2]] == ["bf16 peer", "NVFP4 W4A4", "NVFP4 W4A16", "transformers bf16",
                                              "transformers bf16"]
    assert [r["run_elapsed_s"] for r in rows] == sorted(r["run_elapsed_s"] for r in rows)
    for r in rows:
        assert r["status"] == "ok", r["status"]
        assert r["check"] in ("ok", "reference"), r["check"]
        assert r["tokens_per_s"] > 0 and r["ms_per_token"] > 0 and r["timed_steps"] > 0
        assert r["format"] == "modelopt" and r["preset"] == "tiny" and r["gpu"] and r["git_tree"] is not None
        assert r["planned_rows"] == len(rows) and r["device_type"] == "cpu" and r["budget_s"] is None
        assert r["wall_s"] > 0 and r["load_s"] > 0 and r["checkpoint_write_s"] > 0
        assert r.get("loaded_gib") is None  # memory is measured on a GPU only
    # the W4A16 model and transformers' own agree with the bf16 peer within bf16 noise; W4A4 carries its own error
    err = {(r["model_kind"], r["activations"]): r["logits_rel_err"] for r in rows}
    assert err[("bf16-peer", "bf16")] == 0.0
    assert err[("nvfp4", "bf16")] < 2e-2 and err[("transformers-bf16", "bf16")] < 2e-2
    assert 2e-2 < err[("nvfp4", "nvfp4")] < gb.TOL["nvfp4"]
    # greedy decoding of the same weights: the bf16 peer and transformers' model write the same first tokens
    first = {(r["model_kind"], r["loop"], r["batch"]): r["first_tokens"] for r in rows}
    assert first[("bf16-peer", gb.STATIC, 1)] == first[("transformers-bf16", gb.STATIC, 1)]
    assert first[("transformers-bf16", gb.HF_GENERATE, 2)] == first[("transformers-bf16", gb.STATIC, 2)]


def test_the_report_on_the_tiny_rows(cli_rows):
    _, rows = cli_rows
    df = pd.DataFrame(rows)
    assert not len(gr.latest_run(df, "tiny"))  # a CPU run is never the answer
    run = gr.latest_run(df, "tiny", gpu_only=False)
    # as if measured on a GPU: memory per kind (the bf16 models hold 3.6x the NVFP4 bytes)
    run = run.assign(device_type="cuda", loaded_gib=run["model_kind"].map({"nvfp4": 1.0, "bf16-peer": 3.6,
                                                                           "transformers-bf16": 3.6}),
                     load_peak_gib=4.0)
    tg = gr.targets(run)
    assert list(tg["verdict"].unique())  # every target judged or said not measured
    mem = tg[tg["target"].str.startswith("loaded GPU memory")]
    assert set(mem["verdict"]) == {"held"} and set(mem["measured"]) == {"0.28x"}
    assert set(tg[tg["target"].str.startswith("batch-32")]["verdict"]) == {"not measured"}  # batches 1, 2 only
    tt = gr.tokens_table(run)
    assert list(tt.index)[:2] == ["NVFP4 W4A4 (modelopt)", "NVFP4 W4A16 (modelopt)"]
    assert "tokens/s, batch 2" in tt.columns and not tt.isna().any().any()
    sp = gr.speedup_table(run)
    assert "over bf16 peer" in sp.columns and not sp.isna().any().any()
    assert not gr.memory_table(run).isna().any().any()
    assert not len(gr.not_ok(run))
    assert gr.run_summary(run)["complete"].iloc[0] == "yes"
    gr.figure(run)
    gr.figure(pd.DataFrame())  # no rows: a panel that says so


def test_a_failing_kind_keeps_the_others_rows(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("no memory for the bf16 model")

    monkeypatch.setattr(gb, "load_bf16", broken)
    rows = gb.bench_generate(**{**TINY, "batches": (1,)}, formats=("compressed-tensors",), activations=("bf16",),
                             kinds=("nvfp4", "bf16-peer"), workdir=tmp_path)
    by_kind = {r["model_kind"]: r for r in rows}
    assert len(rows) == 2
    assert by_kind["nvfp4"]["status"] == "ok" and by_kind["nvfp4"]["tokens_per_s"] > 0
    assert by_kind["bf16-peer"]["status"] == "error: RuntimeError: no memory for the bf16 model"
    assert by_kind["nvfp4"]["check"].startswith("no reference logits")
    assert not list(tmp_path.iterdir())  # the checkpoint is deleted


def test_a_stop_keeps_the_rows_measured_so_far(tmp_path):
    def progress(msg):
        if "loading NVFP4 W4A16" in msg:
            raise KeyboardInterrupt  # as the SIGTERM handler of the command raises its own stop

    sunk = []
    rows = gb.bench_generate(**{**TINY, "batches": (1, 2), "progress": progress}, formats=("modelopt",),
                             activations=("bf16",), kinds=("nvfp4", "bf16-peer"), workdir=tmp_path, sink=sunk.append)
    assert sunk == rows  # each row handed on as it was made
    stopped = "not reached: the run was stopped (KeyboardInterrupt)"
    assert [(r["model_kind"], r["batch"], r["status"].split(" after")[0]) for r in rows] == [
        ("bf16-peer", 1, "ok"), ("bf16-peer", 2, "ok"), ("nvfp4", 1, stopped), ("nvfp4", 2, stopped)]
    assert {r["planned_rows"] for r in rows} == {4}
    assert gr.completeness(pd.DataFrame(rows)).startswith("no: 2 of 4 planned rows measured (not reached: the run was")
    assert gr.completeness(pd.DataFrame(rows[:3])).endswith("1 rows never written (the process was killed))")
    assert not list(tmp_path.iterdir())


def test_a_stop_inside_a_capture_still_stops(tmp_path, monkeypatch):
    """A SIGTERM inside a CUDA graph's capture surfaces as the capture's own error (a RuntimeError whose context is
    the stop): the run stops there, instead of recording the error as the model's and going on."""
    import nvfp4lib.hf

    def capture(*args, **kwargs):
        try:
            raise gb._Interrupted("SIGTERM")
        except gb._Interrupted:
            raise RuntimeError("operation failed due to a previous error during capture") from None

    monkeypatch.setattr(nvfp4lib.hf, "generate", capture)
    rows = gb.bench_generate(**{**TINY, "batches": (1, 2)}, formats=("modelopt",), activations=("bf16",),
                             kinds=("bf16-peer", "nvfp4"), workdir=tmp_path)
    assert [r["status"].split(" after")[0] for r in rows] == ["not reached: the run was stopped (SIGTERM)"] * 4


def test_a_time_budget_skips_the_parts_after_it(tmp_path, monkeypatch):
    """A part started within the budget decodes every batch; no part starts after it; the rows say so."""
    clock = {"s": 0.0}  # the run's clock, moved on by hand once the bf16 peer is loaded
    monkeypatch.setattr(gb._Run, "elapsed", lambda self: clock["s"])

    def progress(msg):
        if "bf16 peer loaded" in msg:
            clock["s"] = 100.0

    rows = gb.bench_generate(**{**TINY, "batches": (1, 2), "progress": progress}, formats=("modelopt",),
                             activations=("nvfp4", "bf16"), kinds=("nvfp4", "bf16-peer"), workdir=tmp_path,
                             budget_s=50)
    skipped = "skipped: the time budget of 50 s was spent (at 100 s); lower-priority parts were not started"
    assert [(r["label"], r["batch"], r["status"]) for r in rows] == [("bf16 peer", 1, "ok"), ("bf16 peer", 2, "ok")] + [
        (label, b, skipped) for label in ("NVFP4 W4A4", "NVFP4 W4A16") for b in (1, 2)]
    assert rows[-1]["check"].startswith("no logits") and rows[0]["budget_s"] == 50
    assert gr.completeness(pd.DataFrame(rows)) == f"no: 2 of 6 planned rows measured ({skipped.split(';')[0]})"
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        gb.bench_generate(preset="tiny", device="cpu", budget_s=0, progress=None)


def test_the_bf16_models_hold_the_dequantized_weights(tmp_path):
    from nvfp4lib.formats import dequantize
    from nvfp4lib.hf import make_checkpoint
    from nvfp4lib.hf.checkpoint import Checkpoint, read_nvfp4, read_scheme

    path = make_checkpoint(tmp_path / "m", preset="tiny", fmt="compressed-tensors")
    peer = gb.load_bf16(path, experts="peer", device="cpu")
    hf = gb.load_bf16(path, experts="transformers", device="cpu")
    ck, scheme = Checkpoint(path), read_scheme(path)
    want = {r: dequantize(read_nvfp4(ck, scheme, f"model.layers.1.mlp.experts.3.{r}_proj", "cpu")[0], torch.bfloat16)
            for r in ("gate", "up", "down")}
    moe = peer.model.layers[1].mlp.experts.moe
    inter = moe.intermediate
    assert torch.equal(moe.w13[3, :inter], want["gate"]) and torch.equal(moe.w13[3, inter:], want["up"])
    assert torch.equal(moe.w2[3], want["down"])
    experts = hf.model.layers[1].mlp.experts
    assert torch.equal(experts.gate_up_proj[3], moe.w13[3]) and torch.equal(experts.down_proj[3], moe.w2[3])
    q = dequantize(read_nvfp4(ck, scheme, "model.layers.0.self_attn.q_proj", "cpu")[0], torch.bfloat16)
    assert torch.equal(peer.model.layers[0].self_attn.q_proj.weight, q)
    assert isinstance(peer.model.layers[0].self_attn.q_proj, torch.nn.Linear)
    assert all(p.dtype == torch.bfloat16 for p in hf.parameters())
    with pytest.raises(ValueError, match="experts must be"):
        gb.load_bf16(path, experts="eager", device="cpu")


def test_the_plan_measures_the_targets_first_and_transformers_last():
    plan = gb._plan(("modelopt", "compressed-tensors"), ("nvfp4", "bf16"), gb.KINDS)
    assert plan == [("modelopt", [("bf16-peer", "bf16"), ("nvfp4", "nvfp4"), ("nvfp4", "bf16")]),
                    ("compressed-tensors", [("nvfp4", "nvfp4"), ("nvfp4", "bf16"), ("transformers-bf16", "bf16")])]
    assert gb._plan(("modelopt",), ("bf16",), ("bf16-peer",)) == [("modelopt", [("bf16-peer", "bf16")])]
    with pytest.raises(ValueError, match="format"):
        gb.bench_generate(preset="tiny", formats=("gguf",), device="cpu", progress=None)


def test_profile_step_is_wired_to_the_bench_and_refused_without_a_gpu(monkeypatch, capsys):
    """--profile-step N reaches bench_generate as profile_steps (absent: None); on the CPU, and below 2 replays, the
    run is refused before anything is measured (the profile itself needs a GPU: not run here)."""
    seen = []
    monkeypatch.setattr(gb, "bench_generate", lambda **kw: seen.append(kw) or [])
    args = ["generate-bench", "--preset", "tiny", "--device", "cpu", "--no-record"]
    main(args + ["--profile-step", "7"])
    main(args)
    assert [kw["profile_steps"] for kw in seen] == [7, None]
    monkeypatch.undo()
    assert main(args + ["--profile-step", "5"]) == 2
    assert "profile_steps profiles a CUDA graph's replays: it needs a CUDA GPU" in capsys.readouterr().out
    with pytest.raises(ValueError, match="profile_steps must be >= 2"):
        gb.bench_generate(**TINY, profile_steps=1)


def test_generate_hands_its_step_to_inspect_step(tmp_path):
    from nvfp4lib.hf import from_pretrained, generate, make_checkpoint

    model = from_pretrained(make_checkpoint(tmp_path / "m", preset="tiny", fmt="modelopt"), device="cpu")
    seen = []
    out, _ = generate(model, torch.tensor([[1, 2]]), 3, inspect_step=lambda eager, replay: seen.append((eager, replay)))
    assert len(seen) == 1 and callable(seen[0][0]) and seen[0][1] is None  # no graph without cuda_graph
    seen[0][0]()  # one more eager step of the last position
    assert generate(model, torch.tensor([[1, 2]]), 3)[0].tolist() == out.tolist()


def test_inspect_step_runs_its_steps_within_the_cache(tmp_path):
    """transformers' StaticCache advances its own position with every step (the cache_position passed is not
    read): a profiler's extra steps need room in the cache, and a step past the room is refused before it runs, not
    written past the cache's end (issue 40: an index_copy_ assert on the H100 with --profile-step 20)."""
    from nvfp4lib.hf import from_pretrained, generate, make_checkpoint

    model = from_pretrained(make_checkpoint(tmp_path / "m", preset="tiny", fmt="modelopt"), device="cpu")
    ran = []

    def inspect(eager, replay):
        for _ in range(5):
            eager()
            ran.append(1)
        with pytest.raises(RuntimeError, match="more than inspect_steps = 5"):
            eager()

    out, _ = generate(model, torch.tensor([[1, 2]]), 12, inspect_step=inspect, inspect_steps=5)
    assert len(ran) == 5 and out.shape == (1, 14)
    assert generate(model, torch.tensor([[1, 2]]), 12)[0].tolist() == out.tolist()  # the room changes no token
    with pytest.raises(ValueError, match="inspect_steps must be >= 1"):
        generate(model, torch.tensor([[1, 2]]), 3, inspect_step=inspect, inspect_steps=0)


def _profiled_run(timing_rows: list[dict], loops=(gb.STATIC,), module_error: bool = False) -> list[dict]:
    """A profile run's rows as _Run makes them, from made-up profiles (the shapes profile_runner and module_profile
    return), beside a copy of ``timing_rows``' first row per model as its decode rows; per loop in ``loops`` (the
    compiled loop's times halved); ``module_error``: the split by module failed (no ``eager-modules`` result)."""
    base = {**{k: v for k, v in timing_rows[0].items() if k in ("preset", "model_layers", "prompt_tokens")},
            "run_id": "9999-profile", "device_type": "cuda", "profile_steps": 20, "gpu": "test"}
    plan = [("modelopt", [("bf16-peer", "bf16"), ("nvfp4", "bf16")])]
    run = gb._Run(base, torch.device("cpu"), (1,), None, 8, lambda msg: None, plan, None, None, 0.0, profile_steps=20)
    us = {"bf16-peer": {"torch GEMM": 50.0, "torch grouped GEMM": 70.0, "attention": 10.0},
          "nvfp4": {"serving kernel": 90.0, "nvfp4lib Triton": 5.0, "torch GEMM": 2.0, "attention": 10.0}}
    for kind, act in (("bf16-peer", "bf16"), ("nvfp4", "bf16")):
        for loop in loops:
            f = 0.5 if loop == gb.COMPILED else 1.0
            key = ("modelopt", kind, act, loop, True, 1)
            run.add(key, "ok", {}, ms_per_token=0.2 * f)
            cats = {c: {"us": v * f, "kernels": 3} for c, v in us[kind].items()}
            total = sum(v["us"] for v in cats.values())
            got = {"graph": {"categories": cats, "kernels": 3 * len(cats), "sum_us": total, "span_us": total + 8.0,
                             "gap_us": 8.0, "iters": 20},
                   "eager-modules": {"modules": {"Linear" if kind == "bf16-peer" else "NVFP4Linear": cats},
                                     "iters": 2},
                   "profile_s": 1.0}
            if module_error:
                del got["eager-modules"]
                got["error"] = "RuntimeError: no module ranges"
            run._profile_rows(key, {}, got, 0.2 * f)
    return run.rows


def test_the_report_on_a_profile_run(cli_rows):
    _, rows = cli_rows
    prof = _profiled_run(rows)
    assert {r["profile"] for r in prof if r.get("profile")} == {"graph", "eager-modules"}
    assert gr.completeness(pd.DataFrame(prof)) == "yes"  # the profile rows are extra to the planned ones
    timing = pd.DataFrame(rows).assign(device_type="cuda")
    both = pd.concat([timing, pd.DataFrame(prof)], ignore_index=True)
    assert set(gr.latest_run(both, "tiny")["run_id"]) == set(timing["run_id"])  # a profile run is never the answer
    prun = gr.profile_run(both, "tiny")
    assert set(prun["run_id"]) == {"9999-profile"} and not len(gr.profile_run(timing, "tiny"))
    st = gr.step_table(prun)
    assert list(st.columns) == ["NVFP4 W4A16, batch 1", "bf16 peer, batch 1"]
    assert list(st.index[:5]) == ["serving kernel", "nvfp4lib Triton", "attention", "torch grouped GEMM", "torch GEMM"]
    assert st.loc["serving kernel", "bf16 peer, batch 1"] == 0 and st.loc["step span", "bf16 peer, batch 1"] == 138
    assert st.loc["timed step (decode)", "NVFP4 W4A16, batch 1"] == 200
    d = gr.step_delta(prun)
    assert d.loc["torch GEMM", "NVFP4 W4A16, batch 1 - bf16 peer"] == -48
    assert d.loc["all kernels (sum)", "NVFP4 W4A16, batch 1 - bf16 peer"] == 107 - 130
    mt = gr.module_table(prun)
    assert list(mt.index) == ["Linear", "NVFP4Linear"] and mt.loc["NVFP4Linear", "bf16 peer, batch 1"] == 0
    assert "not recorded yet" in gr.no_profile("tiny").lower()
    # the format's ceiling: the peer's GEMMs (50 + 70 us) less the NVFP4 model's torch GEMM (2 us) of a 200 us step
    fc = gr.format_ceiling(prun)
    r = fc.loc["NVFP4 W4A16, batch 1"]
    assert r["peer's weight GEMMs replaced, us"] == 118 and r["NVFP4 kernels instead, us"] == 95
    assert r["ceiling (NVFP4 GEMMs free)"] == round(200 / (200 - 118), 2) and r["measured speed-up"] == 1
    assert r["NVFP4 kernels' budget for 2x, us"] == 200 / 2 - (200 - 118)  # batch 1's target: 2x the peer


def test_the_profile_report_of_plain_and_compiled_steps(cli_rows):
    """A profile run with plain and compiled decodes: a column per model and loop, each NVFP4 model against the peer
    of its own loop; a failed split by module leaves the graph's rows and one error row."""
    _, rows = cli_rows
    prun = gr.profile_run(pd.DataFrame(_profiled_run(rows, loops=(gb.STATIC, gb.COMPILED))), "tiny")
    c = gr.COMPILED_SUFFIX
    assert list(gr.step_table(prun).columns) == ["NVFP4 W4A16, batch 1", "bf16 peer, batch 1",
                                                 f"NVFP4 W4A16{c}, batch 1", f"bf16 peer{c}, batch 1"]
    d = gr.step_delta(prun)
    assert d.loc["torch GEMM", f"NVFP4 W4A16{c}, batch 1 - bf16 peer"] == -24  # halved: against the compiled peer
    fc = gr.format_ceiling(prun)
    assert fc.loc[f"NVFP4 W4A16{c}, batch 1", "peer's weight GEMMs replaced, us"] == 59
    broken = _profiled_run(rows, module_error=True)
    assert [r["status"] for r in broken if r.get("profile") == "eager-modules"] == \
        ["profile RuntimeError: no module ranges"] * 2
    prun = gr.profile_run(pd.DataFrame(broken), "tiny")
    assert gr.step_table(prun).loc["serving kernel", "NVFP4 W4A16, batch 1"] == 90 and not len(gr.module_table(prun))


def test_compiled_decode_rows_beside_the_plain_ones(tmp_path):
    """--compile: the NVFP4 model and the bf16 peer also decode with the step through torch.compile (a 1-layer tiny
    model on the CPU, Inductor's C++ backend): the same greedy tokens as the plain loop, rows of their own loop, and
    the report compares each compiled NVFP4 series with the compiled peer."""
    pytest.importorskip("torch._inductor")
    rows = gb.bench_generate(**{**TINY, "batches": (1,)}, formats=("modelopt",), activations=("bf16",),
                             kinds=("nvfp4", "bf16-peer"), sizes={"layers": 1}, workdir=tmp_path, compiled=True)
    loops = [(r["model_kind"], r["loop"]) for r in rows]
    assert loops == [("bf16-peer", gb.STATIC), ("bf16-peer", gb.COMPILED), ("nvfp4", gb.STATIC),
                     ("nvfp4", gb.COMPILED)]
    assert all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    assert {r["compile_form"] for r in rows} == {"opaque"}  # (the run's form: the NVFP4 modules as opaque ops)
    first = {(r["model_kind"], r["loop"]): r["first_tokens"] for r in rows}
    for kind in ("bf16-peer", "nvfp4"):
        assert first[(kind, gb.COMPILED)] == first[(kind, gb.STATIC)]
    run = pd.DataFrame(rows).assign(device_type="cuda")
    assert set(gr._ok(run)["series"]) == {"bf16 peer", "bf16 peer" + gr.COMPILED_SUFFIX, "NVFP4 W4A16 (modelopt)",
                                          "NVFP4 W4A16 (modelopt)" + gr.COMPILED_SUFFIX}
    tg = gr.targets(run)
    compiled = tg[tg["NVFP4 model"].str.endswith(gr.COMPILED_SUFFIX) & tg["target"].str.startswith("batch-1 ")]
    assert len(compiled) == 1 and compiled["verdict"].iloc[0] != "not measured"
    ct = gr.compile_table(run)  # the compiled series against its plain loop and the compiled peer
    assert list(ct.index) == [("NVFP4 W4A16 (modelopt)" + gr.COMPILED_SUFFIX, 1)]
    r = ct.iloc[0]
    assert r["form"] == "opaque" and r["tokens equal plain"] == "yes"
    assert abs(r["over compiled peer"] - r["tokens/s"] / r["compiled peer"]) < 0.01  # (shown to 2 decimals)
    hist = gr.targets_history(run.assign(preset=TINY["preset"]), TINY["preset"])
    assert len(hist) == 2 and hist.columns[0].startswith("batch-1 ")  # one line per NVFP4 series of the run


def test_exact_casts_decode_the_plain_tokens_in_w4a4(tmp_path):
    """--compile --exact-casts: the compiled W4A4 step rounds where the eager code does, so it decodes the plain
    loop's tokens (on the CPU, the tiny model); the rows carry the setting and the report names it."""
    pytest.importorskip("torch._inductor")
    rows = gb.bench_generate(**{**TINY, "batches": (1,)}, formats=("modelopt",), activations=("nvfp4",),
                             kinds=("nvfp4",), sizes={"layers": 1}, workdir=tmp_path, compiled=True, exact_casts=True)
    assert [r["status"] for r in rows] == ["ok", "ok"] and {r["compile_exact_casts"] for r in rows} == {True}
    first = {r["loop"]: r["first_tokens"] for r in rows}
    assert first[gb.COMPILED] == first[gb.STATIC]
    ct = gr.compile_table(pd.DataFrame(rows).assign(device_type="cuda"))
    assert list(ct["form"]) == ["opaque, exact casts"] and list(ct["tokens equal plain"]) == ["yes"]


def test_unknown_compile_form_is_refused():
    with pytest.raises(ValueError, match="compile_form"):
        gb.bench_generate(**TINY, compiled=True, compile_form="inlined")


def test_compile_with_an_expert_parallel_model_is_refused():
    from nvfp4lib.hf.generate import generate

    class EPModel(torch.nn.Module):
        nvfp4_ep = object()

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

    with pytest.raises(ValueError, match="expert-parallel"):
        generate(EPModel(), torch.tensor([[1, 2]]), 4, compile=True)
