"""Nsight Compute's pages read into rows (nvfp4lib.bench.ncu_profile), on pages an H200 profile exported (trimmed:
the details' headline metrics, the first 40 SASS lines of each kernel), and the command's checks of its input."""
import argparse
from pathlib import Path

import pytest

from nvfp4lib.bench import ncu_profile as nc

DATA = Path(__file__).parent / "data"


def _pages():
    return (DATA / "ncu_details.csv").read_text(), (DATA / "ncu_source.csv").read_text()


def test_details_are_read_per_kernel_in_one_unit_each():
    rows = nc.parse_details(_pages()[0])
    assert [r["kernel_id"] for r in rows] == [0, 1]
    first = rows[0]
    assert first["kernel"] == "GroupedVarlenGemmSm90"  # (the class, out of CuTe DSL's mangled name)
    assert first["duration_us"] == pytest.approx(12.99)  # (shown in us)
    assert first["sm_mhz"] == pytest.approx(1820.0)  # (shown as 1.82 Ghz)
    assert first["mem_gbps"] == pytest.approx(1090.0)  # (Memory Throughput in Tbyte/s ...)
    assert first["mem_pct"] == pytest.approx(22.83)  # (... and in %: two fields)
    assert first["smem_kb"] == pytest.approx(107.52)
    assert (first["grid"], first["block"], first["registers"]) == (96, 256, 68)
    assert rows[1]["grid"] == 128


def test_units_convert_and_unknown_metrics_are_left_out():
    head = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
    text = head + "\n".join([
        '"0","kernel_x_FooSm90_y","S","Duration","ns","2,500"',
        '"0","kernel_x_FooSm90_y","S","SM Frequency","Mhz","1,755"',
        '"0","kernel_x_FooSm90_y","S","Something Else","","3"',
        '"0","kernel_x_FooSm90_y","S","Grid Size","","n/a"',
    ])
    (row,) = nc.parse_details(text)
    assert row == {"kernel_id": 0, "kernel": "FooSm90", "duration_us": 2.5, "sm_mhz": 1755.0}


def test_source_page_gives_opcode_and_stall_shares():
    parsed = nc.parse_source(_pages()[1])
    assert len(parsed) == 2
    for p in parsed:
        assert p["sass_instructions"] > 0 and p["stall_samples"] > 0
        assert 0 < sum(p["opcodes"].values()) <= 1 + 1e-6 and len(p["opcodes"]) <= nc.TOP_OPCODES
        assert sum(p["stalls"].values()) == pytest.approx(1, abs=1e-3)
        assert all(k.isupper() for k in p["opcodes"]) and not any("Not Issued" in k for k in p["stalls"])


def test_stall_samples_are_placed_by_opcode_and_by_instruction():
    head = ('"Kernel Name","k_FooSm90"\n"Address","Source","Instructions Executed","stall_long_sb","stall_wait",'
            '"stall_wait (Not Issued)"\n')
    text = head + "\n".join([
        '"0x100","      LDG.E R2, [R4.64]","10","0","1","1"',
        '"0x110","      @!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR5], R4","10","6","0","0"',
        '"0x120","      IADD3 R3, R2, 0x1, RZ","10","3","2","2"',
        '"0x130","      SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR6], R4","10","0","0","0"',
    ])
    (p,) = nc.parse_source(text)
    assert p["stall_samples"] == 12 and p["stalls"] == {"long_sb": 0.75, "wait": 0.25}  # (Not Issued left out)
    # per opcode with its first modifier (predicates dropped), each with its main reason and that reason's share
    assert p["stall_ops"] == {"SYNCS.PHASECHK": [0.5, "long_sb", 1.0], "IADD3": [0.4167, "long_sb", 0.6],
                              "LDG.E": [0.0833, "wait", 1.0]}
    # per instruction, most samples first, at its offset from the kernel's first instruction (lines without samples
    # left out)
    assert p["stall_sites"] == [[16, "@!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR5], R4", 0.5, "long_sb"],
                                [32, "IADD3 R3, R2, 0x1, RZ", 0.4167, "long_sb"],
                                [0, "LDG.E R2, [R4.64]", 0.0833, "wait"]]


def test_rows_merge_both_pages_with_labels_and_refuse_a_mismatch():
    details, source = _pages()
    rows = nc.profile_rows(details, source, case="qwen3-t1", gemm="gate/up")
    assert len(rows) == 2 and rows[0]["case"] == "qwen3-t1" and "stalls" in rows[0] and "duration_us" in rows[0]
    assert "stalls" not in nc.profile_rows(details)[0]  # (the details page alone)
    one_kernel = source[:source.index('"Kernel Name"', 10)]
    with pytest.raises(ValueError, match="details page lists 2 kernels and the source page 1"):
        nc.profile_rows(details, one_kernel)


def _args(**kw):
    base = dict(command=[], label=None, kernel="Gemm", count=1, skip=0, report=None, out=None, record=None,
                no_record=True)
    return argparse.Namespace(**{**base, **kw})


def test_command_checks_its_input(monkeypatch):
    with pytest.raises(SystemExit, match="give the profiled command"):
        nc.cmd_ncu(_args(command=["--"]), write=None)
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        nc.cmd_ncu(_args(command=["bench"], label=["case"]), write=None)
    monkeypatch.setattr(nc.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="not on the PATH"):
        nc.cmd_ncu(_args(command=["--", "bench", "--problem", "S4"], label=["case=s4"]), write=None)


def test_profile_table_takes_each_case_latest_run_and_names_the_moe_gemms():
    import pandas as pd

    from nvfp4lib.study.profile_report import profile_table

    details, source = _pages()
    base = {"gpu": "NVIDIA H200", "git_commit": "0123456789"}
    rows = [dict(r, run_id=run, **base) for run in ("20261129T000000Z-a", "20261129T010000Z-b")
            for r in nc.profile_rows(details, source, case="qwen3-moe-T1-bf16")]
    rows += [dict(r, run_id="20261129T000000Z-a", **base) for r in nc.profile_rows(details, source, case="S2-x")]
    rows[2]["duration_us"] = 99.0  # (the later run of the MoE case)
    t = profile_table(pd.DataFrame(rows), "qwen3-moe")
    assert list(t["kernel"]) == ["gate/up", "down"] and list(t["us (ncu)"]) == [99.0, 8.2]
    assert t["top stalls"][0].split()[0] == next(iter(rows[2]["stalls"]))
    assert t["gpu"][0] == "H200" and t["commit"][0] == "0123456"
    s2 = profile_table(pd.DataFrame(rows), "S2")
    assert list(s2["kernel"]) == ["GroupedVarlenGemmSm90 #0", "GroupedVarlenGemmSm90 #1"]
    assert profile_table(pd.DataFrame(rows), "nothing").empty and profile_table(pd.DataFrame()).empty


def test_opcode_difference_keeps_the_opcodes_both_rows_list():
    import pandas as pd

    from nvfp4lib.study.profile_report import opcode_difference

    base = {"kernel_id": 0, "run_id": "r1"}
    rows = pd.DataFrame([
        {**base, "case": "a", "sass_instructions": 10e6, "opcodes": {"LOP3": 0.5, "USEL": 0.15, "UISETP": 0.35}},
        {**base, "case": "b", "sass_instructions": 8e6, "opcodes": {"LOP3": 0.5, "LDS": 0.25, "UISETP": 0.25}},
    ])
    d = opcode_difference(rows, "a", "b")
    assert list(d.index) == ["UISETP", "LOP3"]  # (USEL and LDS are each in one list only: unknown in the other)
    assert d.loc["UISETP", "difference"] == 1.5 and d.loc["LOP3", "difference"] == 1.0
    assert opcode_difference(rows, "a", "missing").empty


def test_timeline_budget_takes_the_latest_probe_run_and_leaves_out_capped_grids():
    import pandas as pd

    from nvfp4lib.kernels.hopper_varlen.kernel import TIMELINE_CTAS
    from nvfp4lib.study.profile_report import timeline_budget

    def gemm(tiles, total, main, span, ctas=None):
        return {"ctas": ctas or tiles, "tiles": tiles, "span_us": span,
                "phases": {"total": [total, total - 1, total + 2], "mainloop": [main, main, main]}}

    base = {"layer": "deepseek-v3", "mode": "nvfp4", "sm_count": 132, "touched_weight_bytes": 3e8,
            "ceil_copy_gbps": 4000.0, "gpu": "NVIDIA H200", "git_commit": "0123456789"}
    rows = pd.DataFrame([
        {**base, "tokens": 8, "run_id": "r2", "timeline": {"gate_up": gemm(264, 10.0, 7.5, 100.0),
                                                           "down": gemm(132, 4.0, 3.0, 50.0)}},
        {**base, "tokens": 64, "run_id": "r2",
         "timeline": {"down": gemm(TIMELINE_CTAS, 4.0, 3.0, 50.0)}},  # (capped: left out)
        {**base, "tokens": 8, "run_id": "r1", "timeline": {"down": gemm(1, 1.0, 1.0, 1.0)}},  # (an earlier run)
        {**base, "tokens": 1, "run_id": "r2", "timeline": {"down": gemm(1, 1.0, 1.0, 1.0)}},  # (T = 1)
        {**base, "tokens": 8, "run_id": "r3", "timeline": None},  # (a timed row, no probe)
    ])
    b = timeline_budget(rows)
    assert list(b["GEMM"]) == ["gate/up", "down"] and list(b["T"]) == [8, 8]
    g = b.iloc[0]
    assert g["per SM"] == 2.0 and g["fixed us"] == 2.5 and g["fixed %"] == 25.0 and g["slowest CTA us"] == 12.0
    assert g["span x mainloop share us"] == 75.0 and g["weights GB/s"] == 2000.0 and g["of copy ceiling %"] == 50.0
    assert b.iloc[1]["weights GB/s"] == 2000.0 and g["commit"] == "0123456"
    assert timeline_budget(pd.DataFrame()).empty
