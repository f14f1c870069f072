"""The multi-process tests' launcher: ranks as fresh spawned processes, joined with a timeout."""
import socket
import time

import pytest
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port free on this machine now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn, args: tuple, nprocs: int, timeout_s: float) -> None:
    """``fn(rank, *args)`` in ``nprocs`` spawned processes; fails the test if one raises (with its traceback, as soon
    as it does) or if they do not all finish within ``timeout_s``; kills whatever is left."""
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"the {nprocs} processes did not finish in {timeout_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
