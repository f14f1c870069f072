"""The study's rounds as commands (CPU): the listing, argument errors, the not-shipped answer, the no-GPU answer,
and the helpers the round notebooks import."""
import subprocess

import pytest
import torch

from nvfp4lib.bench import store
from nvfp4lib.study import experiment
from nvfp4lib.study import helpers as study_helpers
from nvfp4lib.study.cli import main
from nvfp4lib.study.notebooks import NOTEBOOKS, ROOT


def test_list_names_every_round_the_notebooks_show(capsys):
    assert main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("round1", "round2", "round3", "round4", "round5", "fast-path-0", "fast-path-30"):
        assert f"\n{name} " in out
    assert {r.notebook for r in experiment.ROUNDS.values()} == {"02", "03", "04", "05", "06", "09"}
    assert len([r for r in experiment.ROUNDS if r.startswith("fast-path-")]) == 31


def test_argument_errors(capsys):
    with pytest.raises(SystemExit) as e:
        main(["experiment", "no-such-round"])
    assert e.value.code == 2 and "unknown round 'no-such-round'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["experiment"])
    assert e.value.code == 2 and "name a round" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown round"):
        experiment.run_round("round99")


def test_a_round_whose_code_left_prints_the_commit_and_how_to_rerun_it(capsys):
    assert main(["experiment", "fast-path-26"]) == 3  # measured by a development script, now removed
    out = capsys.readouterr().out
    assert "cannot be rerun from this tree" in out and "measured at 146899c" in out
    assert "git show 146899c:nvfp4lib/kernels/hopper_rs.py" in out and "git show 146899c:wip/rs/round25.sh" in out
    assert "git worktree add ../nvfp4lib-146899c 146899c" in out
    assert main(["experiment", "fast-path-2"]) == 3  # v1's vec4_wg2: config and kernel gone
    out = capsys.readouterr().out
    assert "vec4_wg2 are not shipped" in out and ":nvfp4lib/kernels/sm90.py" in out and "NVIDIA H100" in out


def test_v1_steps_are_history_even_where_a_config_name_survives():
    # step 0 ran the removed bf16-decode kernel's `baseline`: today's `baseline` is another kernel's
    assert experiment.missing_configs(experiment.ROUNDS["fast-path-0"]) == ["baseline"]
    assert experiment.missing_configs(experiment.ROUNDS["fast-path-4"]) == []


def test_the_commits_named_hold_the_code():
    """Every round and fast-path step of a Hopper family names code its commits hold (the family folders replaced the
    single files at 034f218: the path depends on the commit)."""
    checked = 0
    for name, rnd in experiment.ROUNDS.items():
        if rnd.family not in experiment.CODE_PATHS:
            continue
        for e in experiment.where_measured(rnd):
            path = experiment.code_path(rnd.family, e["commit"]).rstrip("/")
            assert subprocess.run(["git", "cat-file", "-e", f"{e['commit']}:{path}"], cwd=ROOT).returncode == 0, \
                (name, e["commit"], path)
            checked += 1
    assert checked >= 20
    assert experiment.code_path("hopper_rs", "4bbe590") == "nvfp4lib/kernels/hopper_rs/"
    assert experiment.code_path("hopper_rs", "c16626d") == "nvfp4lib/kernels/hopper_rs.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU answer")
def test_a_shipped_round_says_it_needs_a_gpu(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(store, "SCRATCH_DIR", tmp_path / "build")
    assert main(["experiment", "fast-path-30"]) == 2
    out = capsys.readouterr().out
    assert "needs a CUDA GPU" in out and "python -m nvfp4lib bench --suite benchmark --suite dual" in out
    assert not (tmp_path / "build").exists()


def test_round_notebooks_import_their_helpers_and_read_only_data():
    for nb in sorted(NOTEBOOKS.glob("0[2-5]_*.ipynb")):
        text = nb.read_text()
        assert "nvfp4lib.study.helpers import" in text and "def same_run" not in text, nb.name
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        assert "wip/" not in nb.read_text().replace("migrate_wip_logs", ""), nb.name


def test_recorded_configs_carry_what_the_round_notebooks_need():
    base = study_helpers.ALL["baseline"]
    assert (base.tile_m, base.tile_n, base.tile_k, base.ab_stages) == (128, 128, 256, 1)
    assert "not implemented" in study_helpers.ALL["pingpong"].refused
    res = study_helpers.resources(["baseline", "stages2", "baseline_dual_stages4"])
    assert list(res["stages"]) == [1, 2, 4] and (res["CTAs/SM"] >= 1).all()
    assert study_helpers.register_split(study_helpers.ALL["producer_consumer_tma_batched"]) == (104, 200)
    with pytest.raises(ValueError, match="refused"):
        study_helpers.resources(["tile128x256_1wg"])
