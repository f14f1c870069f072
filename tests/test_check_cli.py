"""`python -m nvfp4lib check` measures against the fp64 reference and writes exactness rows only where asked."""
import json

from nvfp4lib.study.cli import main


def test_check_writes_exactness_rows(tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    rc = main(["check", "--backend", "reference", "--problem", "C1", "--modes", "uniform", "heavy", "--no-record",
               "--out", str(out)])
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["input_mode"] for r in rows] == ["uniform", "heavy"]
    for r in rows:
        assert r["reference"] == "fp64, one rounding" and r["status"] == "ok" and "gpu" in r and "git_commit" in r
        assert r["max_rel_err"] >= 0 and r["elements"] > 0 and 0 <= r["mismatched"] <= r["elements"]
    assert "0 failure(s)" in capsys.readouterr().out


def test_compare_counts_overflow_agreement_and_disagreement():
    import torch

    from nvfp4lib.reference import compare

    ref = [torch.tensor([[1.0, float("inf"), 4.0]], dtype=torch.float16)]
    same = compare([ref[0].clone()], ref)
    assert same["mismatched"] == 0 and same["nonfinite_mismatched"] == 0 and same["rel_err"] == 0.0
    off = compare([torch.tensor([[1.0, 65504.0, 4.5]], dtype=torch.float16)], ref)
    assert off["mismatched"] == 2 and off["nonfinite_mismatched"] == 1
    assert off["max_rel_err"] == 0.5 / 4.0 and off["elements"] == 3


def test_gather_bench_needs_a_gpu_and_says_so(capsys):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the command would measure")
    assert main(["gather-bench", "--problem", "S4", "--no-record"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
