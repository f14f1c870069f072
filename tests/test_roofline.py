"""The two floors (measured, datasheet) and the B200 model: arithmetic on the package's own figures, no GPU."""
import math

import pandas as pd
import pytest

from nvfp4lib import BENCHMARK, DUAL
from nvfp4lib.bench import roofline as rl


def test_both_floors_of_a_problem():
    s4 = next(p for p in BENCHMARK if p.name == "S4")
    measured = {"bf16_tflops": 769.0, "copy_gbps": 2955.0}
    both = rl.floors_us(s4, measured)
    assert set(both) == set(rl.FLOORS) == {"measured", "datasheet"}
    assert both["datasheet"] == pytest.approx(s4.flops() / (989.4e12) * 1e6)  # S4 is compute-bound on an H100
    assert both["measured"] == rl.floor_us(s4, measured) > both["datasheet"]  # the datasheet ceilings are higher
    assert rl.floors_us(s4) == {"datasheet": both["datasheet"]}


def _row(problem, gpu, median_us, run="r1", label="cute-hopper[graph=True]"):
    measured = {"bf16_tflops": 769.0, "copy_gbps": 2955.0}
    return {"problem": problem.name, "gpu": gpu, "median_us": median_us, "flops": problem.flops(),
            "nvfp4_bytes": problem.nvfp4_bytes(), "floor_us": rl.floor_us(problem, measured), "run_id": run,
            "label": label, "status": "ok", "git_commit": "abc1234"}


def test_rows_get_both_ratios_their_gpus_datasheet_and_none_for_an_unknown_gpu():
    s1 = BENCHMARK[0]
    rows = rl.add_floors(pd.DataFrame([_row(s1, "NVIDIA H100 80GB HBM3", 130.0), _row(s1, "NVIDIA H200", 100.0),
                                       _row(s1, "NVIDIA H100 PCIe", 150.0)]))
    h100, h200, other = rows.iloc[0], rows.iloc[1], rows.iloc[2]
    assert h100["floor_datasheet_us"] == pytest.approx(rl.floor_us(s1, rl.H100_SXM_DATASHEET))
    assert h100["x_floor_datasheet"] > h100["x_floor_measured"] == pytest.approx(130.0 / h100["floor_us"])
    assert h200["floor_datasheet_us"] == pytest.approx(rl.floor_us(s1, rl.H200_SXM_DATASHEET))
    assert rl.H200_SXM_DATASHEET["copy_gbps"] > rl.H100_SXM_DATASHEET["copy_gbps"]
    assert math.isnan(other["floor_datasheet_us"])


def test_against_floors_takes_the_latest_run_with_every_shape():
    shapes = BENCHMARK[:2]
    rows = pd.DataFrame([_row(p, "NVIDIA H100 80GB HBM3", 100.0, run="r1") for p in shapes]
                        + [_row(shapes[0], "NVIDIA H100 80GB HBM3", 90.0, run="r2")])  # r2 lacks a shape
    t = rl.against_floors(rows, problems=[p.name for p in shapes])
    assert list(t.index) == [p.name for p in shapes] and set(t["run_id"]) == {"r1"}
    assert {"x measured floor", "x datasheet floor"} <= set(t.columns)
    assert rl.against_floors(rows.iloc[0:0]).empty


def test_b200_is_memory_bound_at_the_study_shapes():
    for p in BENCHMARK + DUAL:
        m = rl.b200_model(p)
        assert m["bound"] == "memory" and m["floor_us"] == m["t_hbm_us"] > m["t_fp4_us"]
        assert m["ridge_flop_per_byte"] == pytest.approx(rl.B200_DATASHEET["fp4_tflops"] / rl.B200_DATASHEET["hbm_gbps"]
                                                         * 1e3)
