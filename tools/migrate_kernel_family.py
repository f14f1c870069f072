"""One-off migration (issue 19): every row of ``data/bench.jsonl`` says which kernel family and config measured it.

Before, ``store.load`` guessed the cute-hopper kernel of a row from its date. This script wrote the answer into the
rows once, explicitly (``store.add_fields``: each changed row keeps its previous state, the fields absent, in its
``amended`` list; no measured value is touched), so that the store guesses nothing:

* ``config``: the config that ran (``info_config``: auto's choice where it chose), else the one asked for
  (``options.config``); None for a peer (a peer has no config; it is its own family);
* ``kernel_family``: for ``cute-hopper``, ``hopper_bf16_decode`` if the row's commit predates 111ecc9 (the commit
  that replaced ``kernels/sm90.py``, the bf16-decode kernel, by the fp16-decode kernel of ``kernels/hopper.py``:
  ``git merge-base --is-ancestor 111ecc9 <git_commit>``), else ``hopper_rs`` for the ``rs_*`` configs (the swap-AB
  register-decode kernel) and ``hopper_smem`` for the others; ``blackwell`` for ``cute-blackwell``; a peer's
  backend name for a peer.

Run once: ``python tools/migrate_kernel_family.py`` (a second run changes nothing: fields a row has are kept).
"""
from __future__ import annotations

import subprocess
import sys
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from nvfp4lib.bench import store  # noqa: E402

V2_SINCE = "111ecc9"


@lru_cache(maxsize=None)
def _after_v1(commit: str) -> bool:
    r = subprocess.run(["git", "merge-base", "--is-ancestor", V2_SINCE, commit], cwd=store.DATA_DIR.parent)
    if r.returncode not in (0, 1):
        raise SystemExit(f"git cannot place commit {commit!r} relative to {V2_SINCE}")
    return r.returncode == 0


def fields(row: dict) -> dict:
    backend = row.get("backend")
    if backend is None:
        return {}
    if not backend.startswith("cute-"):
        return {"config": None, "kernel_family": backend}
    config = row.get("info_config") or (row.get("options") or {}).get("config") or "auto"
    if backend == "cute-blackwell":
        return {"config": config, "kernel_family": "blackwell"}
    if not _after_v1(row["git_commit"]):
        family = "hopper_bf16_decode"
    else:
        family = "hopper_rs" if str(config).startswith("rs_") else "hopper_smem"
    return {"config": config, "kernel_family": family}


if __name__ == "__main__":
    n = store.add_fields(store.BENCH, fields, "issue 19: kernel family and config written explicitly "
                         "(tools/migrate_kernel_family.py); store.load no longer infers them from the date")
    print(f"{n} rows of {store.BENCH} given kernel_family and config")
