"""The README's headline is what data/bench.jsonl gives, and the table is computed right from synthetic runs."""
import pandas as pd
import pytest

from nvfp4lib.bench import store
from nvfp4lib.bench.store import DATA_DIR
from nvfp4lib.problems import get_problem
from nvfp4lib.study import headline

README = DATA_DIR.parent / "README.md"


def test_readme_headline_matches_data():
    block = headline.readme_block(README)
    assert block is not None, "README lost its headline markers"
    assert block == headline.markdown(headline.headline(store.load())), \
        "README's headline is stale: run python -m nvfp4lib headline --write README.md"
    assert headline.readme_block(README, headline.SHAPES_START, headline.SHAPES_END) == headline.shapes_markdown()


def test_readme_is_a_newcomers_page():
    """Short, no development log: no path outside the repository, no commit hash outside the generated blocks."""
    import re

    text = README.read_text()
    assert len(text.splitlines()) <= 150
    outside = re.sub(re.escape(headline.START) + ".*?" + re.escape(headline.END), "", text, flags=re.S)
    assert "../" not in outside and "/work/" not in outside
    assert not re.search(r"\b[0-9a-f]{7,40}\b", outside), "a commit hash in the README's prose"


def _rows(runs: int, commit: str = "abc1234", slow_triton: float = 3.0):
    rows = []
    for r in range(runs):
        for name in headline.PROBLEMS:
            prob = get_problem(name)
            base = {"run_id": f"run{r}", "date": f"2026-11-25T0{r}:00:00+00:00", "git_commit": commit,
                    "gpu": "NVIDIA H100 80GB HBM3", "problem": name, "status": "ok", "flops": prob.flops(),
                    "nvfp4_bytes": prob.nvfp4_bytes(), "floor_us": 10.0, "iters": 30}
            fam = {"kernel_family": headline.FAMILY}
            rows.append({**base, **fam, "label": headline.DEFAULT, "median_us": 20.0 + r, "info_config": "vl_x"})
            rows.append({**base, **fam, "label": headline.EAGER, "median_us": 25.0 + r, "info_config": "vl_x"})
            rows.append({**base, "label": headline.PREDEQUANT, "median_us": 40.0 + 2 * r,
                         "notes": f"operands held as bf16 with the {headline.FAIR_PEER_NOTE}: 1 MB"})
            rows.append({**base, "label": "triton[graph=True]", "median_us": slow_triton * (20.0 + r)})
            rows.append({**base, "label": "triton-fast[graph=True]", "median_us": 2.0 * (20.0 + r)})
    return pd.DataFrame(rows)


def test_headline_statistics_over_runs():
    h = headline.headline(_rows(5))
    assert h["commit"] == "abc1234" and len(h["runs"]) == 5
    s1 = h["rows"][0]
    assert s1["us"] == (22.0, 20.0, 24.0)
    assert s1["xm"] == (2.2, 2.0, 2.4)
    assert s1["vs_pre"] == pytest.approx((2.0, 2.0, 2.0))
    assert s1["vs_tri"] == pytest.approx((2.0, 2.0, 2.0))  # the fastest Triton label per run
    assert s1["tri_labels"] == ["triton-fast[graph=True]"]
    text = headline.markdown(h)
    assert "5 separate runs of `python -m nvfp4lib bench` at commit `abc1234`" in text
    assert "median of 30 calls" in text and "**22.0 (20.0–24.0)**" in text
    assert "| 27.0 (25.0–29.0) |" in text  # the eager call beside the graph replay


def test_headline_prefers_a_commit_with_five_runs():
    df = pd.concat([_rows(5, "old0001"), _rows(2, "new0002").assign(run_id=lambda d: d["run_id"] + "n",
                                                                       date="2026-11-26T00:00:00+00:00")])
    assert headline.qualifying_runs(df)[0] == "old0001"
    assert headline.qualifying_runs(_rows(2, "new0002"))[0] == "new0002"  # fewer than five: the latest, said so


def test_rows_of_other_kernels_or_the_old_peer_do_not_count():
    """The study's host-scheduled kernel once ran under the same label, and the bf16 peer once timed extra work."""
    df = _rows(5)
    old_kernel = df.assign(kernel_family="hopper_rs", run_id=df["run_id"] + "k", git_commit="k000001",
                           date="2026-11-27T00:00:00+00:00")
    old_peer = df.assign(notes="weights and activations held as bf16", run_id=df["run_id"] + "p",
                         git_commit="p000001", date="2026-11-27T00:00:00+00:00")
    assert headline.qualifying_runs(pd.concat([df, old_kernel, old_peer]))[0] == "abc1234"


def test_a_run_missing_a_peer_does_not_qualify():
    df = _rows(5)
    df = df[~((df["run_id"] == "run0") & (df["label"] == headline.PREDEQUANT) & (df["problem"] == "S3"))]
    assert len(headline.qualifying_runs(df)[1]) == 4


def test_write_readme_needs_markers(tmp_path):
    f = tmp_path / "R.md"
    f.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        headline.write_readme(f, "x")
    f.write_text(f"a\n{headline.START}\nold\n{headline.END}\nb")
    assert headline.write_readme(f, "new") and headline.readme_block(f) == "new"
    assert not headline.write_readme(f, "new")
