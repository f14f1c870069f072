import json

import pytest

from nvfp4lib.bench import store
from nvfp4lib.bench.harness import BackendSpec
from nvfp4lib.study.cli import main


def test_append_only_and_merge(tmp_path):
    f = tmp_path / "bench.jsonl"
    store.append_rows(f, [{"run_id": "r1", "gpu": "H100", "x": 1}])
    store.append_rows(f, [{"run_id": "r2", "gpu": "H100", "x": 2}, {"run_id": "r2", "gpu": "H100", "x": 3}])
    assert [r["x"] for r in store.read_rows(f)] == [1, 2, 3]
    src = tmp_path / "from_gpu.jsonl"
    store.append_rows(src, [{"run_id": "r2", "gpu": "H100", "x": 2}, {"run_id": "r3", "gpu": "H100", "x": 4}])
    assert store.merge(src, f) == 1  # r2 is already there
    assert store.merge(src, f) == 0  # idempotent
    assert [r["x"] for r in store.read_rows(f)] == [1, 2, 3, 4]


def test_rows_need_run_id_and_provenance(tmp_path):
    with pytest.raises(ValueError, match="run_id"):
        store.append_rows(tmp_path / "x.jsonl", [{"gpu": "H100"}])
    src = tmp_path / "s.jsonl"
    src.write_text(json.dumps({"run_id": "r9"}) + "\n")
    with pytest.raises(ValueError, match="provenance"):
        store.merge(src, tmp_path / "d.jsonl")
    assert not (tmp_path / "d.jsonl").exists()


def test_corrupt_file_is_reported(tmp_path):
    f = tmp_path / "b.jsonl"
    f.write_text('{"run_id": "a"}\nnot json\n')
    with pytest.raises(ValueError, match=":2:"):
        store.read_rows(f)


def test_provenance_names_the_machine():
    p = store.provenance()
    for key in ("date", "git_commit", "torch", "cutlass_dsl", "gpu"):
        assert key in p


def test_record_command(tmp_path, capsys):
    src = tmp_path / "new.jsonl"
    store.append_rows(src, [{"run_id": "z", "gpu": "H100"}])
    dst = tmp_path / "bench.jsonl"
    assert main(["record", str(src), "--into", str(dst)]) == 0
    assert "1 new rows" in capsys.readouterr().out
    assert len(store.read_rows(dst)) == 1


def test_backend_spec_parsing():
    s = BackendSpec.parse("cute-hopper:config=baseline,graph=1,iters=3")
    assert s.backend == "cute-hopper" and s.options == {"config": "baseline", "graph": True, "iters": 3}
    assert s.name == "cute-hopper[config=baseline,graph=True,iters=3]"
    with pytest.raises(ValueError, match="key=value"):
        BackendSpec.parse("torch-bf16:graph")


def test_bench_refuses_without_gpu():
    import torch
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    from nvfp4lib.bench.harness import bench
    from nvfp4lib.problems import BENCHMARK
    with pytest.raises(RuntimeError, match="CUDA"):
        bench(["reference"], BENCHMARK[:1])


def test_check_command_on_cpu(capsys):
    assert main(["check", "--backend", "reference", "--problem", "C1", "--modes", "uniform"]) == 0
    assert "0 failure(s)" in capsys.readouterr().out


def test_b200_check_refuses_off_blackwell(capsys):
    import torch
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10:
        pytest.skip("this is a B200")
    assert main(["b200-check"]) == 2
    assert "needs an sm_100 GPU" in capsys.readouterr().out


def test_compile_command_records_refusals(tmp_path, capsys):
    out = tmp_path / "compile.jsonl"
    assert main(["compile", "--arch", "sm_90a", "--config", "tile128x256_1wg", "--record", str(out)]) == 0
    rows = store.read_rows(out)
    assert rows[0]["config"] == "tile128x256_1wg" and "accumulator registers" in rows[0]["error"]
    assert rows[0]["gpu"]


def test_amend_keeps_the_old_values_and_refuses_measurements(tmp_path):
    path = tmp_path / "b.jsonl"
    store.append_rows(path, [{"run_id": "r1", "git_commit": "old", "median_us": 1.0},
                             {"run_id": "r2", "git_commit": "other", "median_us": 2.0}])
    assert store.amend(path, {"r1"}, "stale .git", git_commit="new") == 1
    rows = {r["run_id"]: r for r in store.read_rows(path)}
    assert rows["r1"]["git_commit"] == "new" and rows["r1"]["amended"][0]["previous"] == {"git_commit": "old"}
    assert rows["r2"]["git_commit"] == "other" and "amended" not in rows["r2"]
    with pytest.raises(ValueError, match="measurements"):
        store.amend(path, {"r1"}, "no", median_us=0.5)


def test_provenance_names_the_tree_and_its_commit():
    """The tree id is git's hash of the working copy; a commit is named only when it has exactly that tree."""
    p = store.provenance()
    assert p["git_tree"] and len(p["git_tree"]) == 40
    assert p["cutlass_dsl"] == "4.3.5"  # read from the installed package's metadata
    if p["git_dirty"] is False:
        assert store._git("rev-parse", f"{p['git_commit']}^{{tree}}") == p["git_tree"]
    else:
        assert p["git_commit"] == "unknown"


def test_rows_from_a_stale_clone_get_their_commit_from_the_tree():
    head = store._git("rev-parse", "HEAD")
    tree = store._git("rev-parse", "HEAD^{tree}")
    rows = [{"run_id": "x", "git_commit": "unknown", "git_dirty": True, "git_tree": tree},
            {"run_id": "y", "git_commit": "unknown", "git_dirty": True, "git_tree": "0" * 40}]
    store.resolve_commits(rows)
    assert (rows[0]["git_commit"], rows[0]["git_dirty"]) == (head, False)
    assert (rows[1]["git_commit"], rows[1]["git_dirty"]) == ("unknown", True)


def test_a_copy_without_the_rendered_figures_is_its_commits_code():
    """The GPU machine's copy may leave out figures/, or figures/ and data/ (outputs and records, not code): the row
    gets the commit and says what its copy left out."""
    head = store._git("rev-parse", "HEAD")
    tree = store._git("rev-parse", "HEAD^{tree}")
    assert store.tree_without(tree, ()) == tree  # git's own hash, recomputed
    slim = store.tree_without(tree, ("figures",))
    slimmer = store.tree_without(tree, ("figures", "data"))
    assert len({slim, slimmer, tree}) == 3
    rows = store.resolve_commits([{"run_id": "x", "git_commit": "unknown", "git_dirty": True, "git_tree": slim},
                                  {"run_id": "y", "git_commit": "unknown", "git_dirty": True, "git_tree": tree},
                                  {"run_id": "z", "git_commit": "unknown", "git_dirty": True, "git_tree": slimmer}])
    assert (rows[0]["git_commit"], rows[0]["git_dirty"], rows[0]["git_tree_omits"]) == (head, False, ["figures"])
    assert rows[1]["git_commit"] == head and "git_tree_omits" not in rows[1]
    assert (rows[2]["git_commit"], rows[2]["git_tree_omits"]) == (head, ["figures", "data"])
    assert store.commit_of_tree(store.tree_without(tree, ("nvfp4lib",)), omit=store.OMITTABLE) is None  # code


def test_rows_name_the_hopper_kernel_that_measured_them(tmp_path):
    # the kernel column is read from each row's explicit kernel_family; a row without one is not guessed from its date
    path = tmp_path / "b.jsonl"
    store.append_rows(path, [
        {"run_id": "a", "backend": "cute-hopper", "kernel_family": "hopper_bf16_decode", "date": "2026-11-23"},
        {"run_id": "b", "backend": "cute-hopper", "kernel_family": "hopper_smem", "date": "2026-11-22"},
        {"run_id": "c", "backend": "cute-hopper", "kernel_family": "hopper_rs", "info_config": "rs_m128_t96"},
        {"run_id": "b", "backend": "triton", "kernel_family": "triton"},
        {"run_id": "d", "backend": "cute-hopper", "date": "2026-11-23T07:30:00+00:00"}])
    kernels = store.load(path)["kernel"]
    assert list(kernels[:3]) == list(store.HOPPER_KERNELS) and kernels.isna()[3] and kernels.isna()[4]
    assert not hasattr(store, "HOPPER_FP16_SINCE") and not hasattr(store, "hopper_kernel")


def test_every_recorded_bench_row_says_what_made_it():
    rows = store.read_rows(store.BENCH)
    assert rows and all({"kernel_family", "config"} <= set(r) for r in rows)
    for r in rows:
        assert r["kernel_family"] == r["backend"] if not r["backend"].startswith("cute-") else (
            r["kernel_family"] in store.FAMILIES)


def test_add_fields_keeps_the_previous_state_and_never_touches_measurements(tmp_path):
    path = tmp_path / "b.jsonl"
    store.append_rows(path, [{"run_id": "a", "median_us": 1.5, "backend": "x"},
                             {"run_id": "b", "median_us": 2.5, "backend": "y", "config": "kept"}])
    n = store.add_fields(path, lambda r: {"config": "c-" + r["backend"], "kernel_family": r["backend"]}, "why")
    a, b = store.read_rows(path)
    assert n == 2 and a["config"] == "c-x" and b["config"] == "kept" and b["kernel_family"] == "y"
    assert a["median_us"] == 1.5 and a["amended"][0]["reason"] == "why"
    assert a["amended"][0]["previous"] == {"config": None, "kernel_family": None}
    assert b["amended"][0]["previous"] == {"kernel_family": None}
    assert store.add_fields(path, lambda r: {"config": "again"}, "no-op") == 0
    with pytest.raises(ValueError, match="measurements"):
        store.add_fields(path, lambda r: {"p90_us": 1.0}, "no")


def test_merge_refuses_bench_rows_that_do_not_say_what_made_them(tmp_path):
    src = tmp_path / "from_gpu.jsonl"
    store.append_rows(src, [{"run_id": "r1", "gpu": "H100", "backend": "cute-hopper", "options": {}}])
    with pytest.raises(ValueError, match="kernel_family"):
        store.merge(src, tmp_path / "bench.jsonl")


def test_kernel_family_of_a_new_row():
    assert store.kernel_family("triton", None) == "triton"
    assert store.kernel_family("cute-blackwell", "baseline") == "blackwell"
    assert store.kernel_family("cute-hopper", "baseline") == "hopper_smem"
    assert store.kernel_family("cute-hopper", "auto") == "hopper_varlen"  # the serving kernel users call
    assert store.kernel_family("cute-hopper", "vl_m128_t128_k128_s3_e") == "hopper_varlen"
    assert store.kernel_family("cute-hopper", "study-auto") == "hopper_rs"
    assert "not resolved" in store.kernel_family("cute-hopper", "no_such_config")
    from nvfp4lib.kernels.hopper_smem import kernel as hopper

    rs = [n for n, c in hopper.CONFIGS.items() if c.family == "hopper_rs"]
    assert rs and all(store.kernel_family("cute-hopper", n) == "hopper_rs" for n in rs)
