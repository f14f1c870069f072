"""What the development logs measured lives in data/history.jsonl, with provenance; no scratch tree remains."""
import importlib.util
import json

from nvfp4lib.bench import store
from nvfp4lib.study.notebooks import ROOT

KINDS = {"dev check", "profile span", "timeline", "dev bench", "k sweep", "launch", "gpu tests", "fp16 dev run"}


def _migration():
    spec = importlib.util.spec_from_file_location("migrate_wip_logs", ROOT / "tools" / "migrate_wip_logs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_history_rows_have_provenance():
    rows = store.read_rows(store.HISTORY)
    assert len(rows) > 1000
    assert {r["kind"] for r in rows} == KINDS
    for r in rows:
        assert len(r["git_commit"]) == 40 and r["date"].startswith("2026-11-2") and r["source_log"].startswith("wip/")
        assert r["gpu"] in (None, "NVIDIA H100 80GB HBM3", "H200")
        assert (r["gpu"] is None) == (r["gpu_source"] == "not recorded in the log")
    assert {r["gpu"] for r in rows if "_H200" in r["source_log"]} == {"H200"}


def test_the_log_parser_reads_each_format():
    parse = _migration().parse
    rows = parse("""S4 rs_x_timeline: prologue + GEMM (graph)
   entry           min   0.00  med   0.51  max   0.77 us
   stored          min  11.52  med  11.78  max  12.29 us
S4       rs_x                 sum=   16.8 us  span=15.2 us  GroupedNvfp4GemmSm90RS=13.7 ActivationPrologueSm90=3.0
ok   cute-hopper[config=rs_x] C1               gaussian seed=1111   rel_err 8.60e-06
S4       rs_x       act_smem,param_groups=(32768, 16)    17.31 us  rel_err 1.5e-05
/usr/lib/python3/x.py:12: UserWarning: not a row
677 passed, 1570 deselected, 42 warnings in 408.97s (0:06:48)""")
    assert [r["kind"] for r in rows] == ["timeline", "profile span", "dev check", "dev bench", "gpu tests"]
    assert rows[0]["points"] == {"entry": [0.0, 0.51, 0.77], "stored": [11.52, 11.78, 12.29]}
    assert rows[0]["config"] == "rs_x" and rows[0]["section"] == "prologue + GEMM"
    assert rows[1]["span_us"] == 15.2 and rows[1]["kernels_us"]["ActivationPrologueSm90"] == 3.0
    assert rows[3]["act_smem"] == 32768 and rows[3]["param_groups"] == 16 and rows[3]["median_us"] == 17.31
    assert rows[4]["passed"] == 677


def test_the_migration_refuses_to_run_twice(tmp_path):
    out = tmp_path / "h.jsonl"
    out.write_text(json.dumps({"source_log": "wip/rs/gpu_logs/round2_profile.log"}) + "\n")
    import pytest
    with pytest.raises(SystemExit, match="runs once"):
        _migration().migrate(out=out)


def test_no_scratch_tree():
    assert not (ROOT / "wip").exists()
