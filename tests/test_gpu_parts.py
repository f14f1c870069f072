"""`make gpu-test GPU_PART=i/n`: the GPU suite in n parts that together hold every GPU test once and never split an
xdist group (the tests that share one compiled kernel), for machines that limit a command's time."""
import os
import subprocess
import sys

import pytest

from tests.conftest import gpu_part_key

ROOT = os.path.join(os.path.dirname(__file__), "..")


class _Collected:
    def __init__(self):
        self.items = []

    def pytest_collection_finish(self, session):
        self.items = [(item.nodeid, gpu_part_key(item)) for item in session.items]
        self.long = [item.get_closest_marker("long_gpu") is not None for item in session.items]


def _collect(monkeypatch, part: str | None) -> _Collected:
    if part:
        monkeypatch.setenv("NVFP4LIB_GPU_PART", part)
    else:
        monkeypatch.delenv("NVFP4LIB_GPU_PART", raising=False)
    got = _Collected()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", os.path.join(ROOT, "tests/gpu")],
                       plugins=[got])
    assert code == 0
    return got


def test_parts_cover_the_suite_once_and_keep_groups_whole(monkeypatch):
    got = _collect(monkeypatch, None)
    whole = got.items
    parts = [_collect(monkeypatch, f"{i}/3").items for i in (1, 2, 3)]
    # the long GPU tests are collected first (started late, one would outlast a time-limited part)
    assert any(got.long) and got.long == sorted(got.long, reverse=True)
    assert len(whole) > 100 and all(parts)
    assert sorted(sum(parts, [])) == sorted(whole)  # each test in exactly one part
    part_of_group = {}
    for i, part in enumerate(parts):
        for nodeid, group in part:
            assert part_of_group.setdefault(group, i) == i, f"{nodeid}: its group {group} is split over parts"
    grouped = [g for _, g in whole if "::" not in g]  # units named by an xdist group, not by one test
    assert len(grouped) > len(set(grouped)), "no xdist group holds two tests: nothing checked that groups stay whole"
    sizes = [len(p) for p in parts]
    assert max(sizes) < 1.5 * min(sizes), sizes


def test_a_bad_part_is_refused():
    env = {**os.environ, "NVFP4LIB_GPU_PART": "4/3"}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/gpu"], capture_output=True,
                         text=True, env=env, cwd=ROOT)
    assert out.returncode != 0 and "1 <= i <= n" in out.stdout + out.stderr


def test_each_test_phase_is_logged_as_it_ends(tmp_path, monkeypatch):
    """NVFP4LIB_TEST_TIMES: a line per test phase (node id, phase, seconds, outcome) appended as it ends; nothing
    without the variable, nothing from an xdist worker (the controller writes)."""
    from types import SimpleNamespace

    from tests.conftest import pytest_runtest_logreport as log

    path = tmp_path / "times.tsv"
    report = SimpleNamespace(nodeid="tests/x.py::test_y", when="call", duration=12.345, outcome="passed")
    monkeypatch.delenv("NVFP4LIB_TEST_TIMES", raising=False)
    log(report)
    assert not path.exists()
    monkeypatch.setenv("NVFP4LIB_TEST_TIMES", str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    log(report)
    assert not path.exists()
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    log(report)
    log(SimpleNamespace(nodeid="tests/x.py::test_z", when="setup", duration=0.5, outcome="failed"))
    assert path.read_text().splitlines() == ["tests/x.py::test_y\tcall\t12.35\tpassed",
                                            "tests/x.py::test_z\tsetup\t0.50\tfailed"]
