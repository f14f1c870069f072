import os

import pytest
import torch

# An xdist worker's share of the cores for torch's CPU threads: every worker defaults to one thread per core, so 16
# workers on 16 cores ran 256 threads; the GPU suite's inputs are made on the CPU (problems.make_inputs, ~20 s for an
# S2-dual case on one core here), and its S2-dual exactness tests took 180-195 s each at 16 workers (H200 host,
# 2026-11-28, NVFP4LIB_TEST_TIMES) against ~85 s for the S4 cases.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


def gpu_part_key(item) -> str:
    """The unit a part of the GPU suite keeps whole: the test's xdist group (tests that share a compiled kernel), or
    the test itself."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return mark.args[0] if mark.args else mark.kwargs.get("name", item.nodeid)
    return item.nodeid


def parse_part(spec: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise pytest.UsageError(f"NVFP4LIB_GPU_PART={spec!r}: give i/n with 1 <= i <= n, e.g. 2/5")
    return i, n


def pytest_collection_modifyitems(config, items):
    # the GPU suite's longest tests first: started late, one of them would outlast a time-limited run on its own
    items.sort(key=lambda item: item.get_closest_marker("long_gpu") is None)
    spec = os.environ.get("NVFP4LIB_GPU_PART")
    if spec:  # one of n parts of the GPU suite (for machines that limit a command's time): CPU tests are kept
        i, n = parse_part(spec)
        order, keep, drop = {}, [], []  # units numbered as they first appear, dealt round-robin: every file spreads
        for item in items:
            if "gpu" in item.keywords and order.setdefault(gpu_part_key(item), len(order)) % n != i - 1:
                drop.append(item)
            else:
                keep.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """With ``NVFP4LIB_TEST_TIMES=FILE``: each test phase's duration appended to FILE as it ends (tab-separated node
    id, phase, seconds, outcome), so a run cut off by a machine's time limit still says what took its time (pytest's
    --durations and junit report are written only at the end). Written once, by the controller under xdist."""
    path = os.environ.get("NVFP4LIB_TEST_TIMES")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(path, "a") as f:
        f.write(f"{report.nodeid}\t{report.when}\t{report.duration:.2f}\t{report.outcome}\n")
