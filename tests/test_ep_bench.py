"""The expert-parallel MoE bench (`moe-bench --ep W`, nvfp4lib.bench.ep_bench) end to end on the CPU: 2 gloo processes
launched as torchrun launches them (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the environment), the command line parsed
and run in each (the reference backend, a tiny layer, no CUDA graphs), rank 0's rows read back from --out: every form
present, checked exact against the single-process layer, timed per phase, with provenance. Also the pieces that need
no processes: layer shapes, the defaults, the runtime estimate, the refusal to run outside torchrun."""
import json
import os
import time

import pytest

from nvfp4lib.bench import ep_bench as eb
from nvfp4lib.bench import moe_bench as mb
from tests.ranks import free_port, run_ranks

W = 2
TIMEOUT_S = 120
TINY = "8,2,64,32"  # E, k, H, I
TOKENS = (1, 3)


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(W), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="")  # the CPU path, also on a GPU host
    import torch

    torch.set_num_threads(1)
    from nvfp4lib.study.cli import main

    rc = main(["moe-bench", "--ep", str(W), "--layer", TINY, "--tokens", *map(str, TOKENS), "--transport",
               "all-gather", "--backend", "reference", "--iters", "2", "--step-timeout", "60", "--out", out,
               "--no-record"])
    if rc:
        raise SystemExit(rc)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep") / "ep.jsonl"
    run_ranks(_rank, (free_port(), str(out)), W, TIMEOUT_S)
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_every_form_has_a_row_and_all_are_ok(rows):
    kinds = ("nvfp4", "bf16", "peer")
    ep = {(r["kind"], r["tokens"]) for r in rows if r["form"] == "ep"}
    single = {(r["kind"], r["tokens"]) for r in rows if r["form"] == "single"}
    assert ep == {(k, t) for k in kinds for t in TOKENS}
    assert single == {(k, t) for k in ("nvfp4", "bf16") for t in TOKENS}  # one GPU: the NVFP4 modes
    assert len(rows) == len(ep) + len(single)
    assert [r["status"] for r in rows] == ["ok"] * len(rows)
    assert len({r["run_id"] for r in rows}) == 1


def test_rows_are_exact_against_the_single_process_layer(rows):
    for r in rows:
        if r["form"] != "ep":
            continue
        assert len(r["rel_err_ranks"]) == W
        if r["kind"] == "peer":  # the bf16 peer against the W4A16 layer: its bf16 roundings
            assert 0 < r["rel_err"] <= mb.TOL["peer"] == r["tol"]
        else:  # top-2 on the all-gather transport: bit-identical (the reference backend)
            assert r["rel_err"] == 0 and r["bit_identical"] and r["eager_rel_err"] == 0, r
        assert sum(r["recv_rows_ranks"]) == W * r["tokens"] * r["top_k"]  # every copy reached its owner once


def test_rows_carry_the_phases_the_setup_and_provenance(rows):
    for r in rows:
        assert r["world"] == W and r["total_tokens"] == W * r["tokens"] and r["graph"] is False
        assert (r["experts"], r["top_k"], r["hidden"], r["intermediate"]) == (8, 2, 64, 32)
        assert r["gpu"] == "none (CPU)" and r["gpus_ranks"] == ["none (CPU)"] * W
        assert r["git_tree"] and r["torch"] and r["date"]
        assert set(eb.PHASES) == set(r["phases"])
        if r["form"] == "single":
            assert r["gpus_used"] == 1 and r["transport"] is None and r["single_us"] > 0
            continue
        assert r["gpus_used"] == W and r["transport"] == "all-gather" and r["capacity"] == r["tokens"]
        for phase in ("step", "dispatch", "transport", "experts"):
            assert r[f"{phase}_us"] == max(r[f"{phase}_us_ranks"]) > 0
        assert r["combine_us"] == pytest.approx(r["transport_us"] - r["dispatch_us"])
        assert r["overlap_us"] == pytest.approx(r["step_us"] - r["transport_us"] - r["experts_us"])
        assert r["median_us"] == r["step_us"]


def test_outside_torchrun_the_command_says_how_to_launch(monkeypatch, capsys):
    from nvfp4lib.study.cli import main

    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert main(["moe-bench", "--ep", "2"]) == 2
    assert "torchrun --nproc_per_node 2 -m nvfp4lib moe-bench --ep 2" in capsys.readouterr().err


def test_layer_shapes_and_defaults():
    tiny = mb.get_layer(TINY)
    assert (tiny.experts, tiny.top_k, tiny.hidden, tiny.intermediate) == (8, 2, 64, 32)
    with pytest.raises(ValueError, match="top-k"):
        mb.get_layer("8,9,64,32")
    assert [mb.get_layer(x).experts for x in eb.EP_LAYERS] == [256, 128]  # the layers
    assert eb.EP_TOKENS == (1, 8, 64, 4096)
    from nvfp4lib.nn.ep import TRANSPORTS

    assert mb.EP_TRANSPORTS == TRANSPORTS


def test_the_default_grid_is_estimated_under_six_minutes_on_two_gpus():
    est = eb.estimate_s(eb.EP_LAYERS, eb.EP_TOKENS, mb.EP_TRANSPORTS, world=2)
    assert 60 < est < 6 * 60
    fewer = eb.estimate_s(["qwen3-moe"], (1,), ("all-gather",), world=2)
    assert fewer < est / 10


def test_the_watchdog_ends_a_stuck_process():
    import subprocess
    import sys

    code = ("import time\nfrom nvfp4lib.bench.ep_bench import Watchdog\n"
            "w = Watchdog(1.0, lambda what: print('fired in', what, flush=True))\nw.kick('stage x')\ntime.sleep(30)\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 124 and "fired in stage x" in p.stdout
    assert "no progress for 1 s in stage x" in p.stderr
    assert time.monotonic() - t0 < 20
