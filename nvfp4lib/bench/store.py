"""The results store: append-only JSON-lines tables with provenance.

Every measurement row carries where and when it was taken (GPU, clocks, driver,
library versions, git commit, date) and a ``run_id`` shared by the rows of one
run. Rows are only ever appended, all rows of a run at once, so a run that fails
writes nothing and no earlier row is ever rewritten.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import uuid
from importlib import metadata
from pathlib import Path

import torch

from ..kernels.common.compiling import cutlass_dsl_version

__all__ = ["DATA_DIR", "append_rows", "load", "merge", "provenance", "new_run_id", "kernel_family", "add_fields",
           "dirty_state"]

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
BENCH = DATA_DIR / "bench.jsonl"
HISTORY = DATA_DIR / "history.jsonl"  # what the development logs measured (rounds of notebook 09), with their commits
COMPILE = DATA_DIR / "compile.jsonl"
PROBES = DATA_DIR / "probes.jsonl"
CALLS = DATA_DIR / "calls.jsonl"  # the serving path per call form (nvfp4lib.bench.calls)
MOE = DATA_DIR / "moe.jsonl"  # the MoE layer against its bf16 peer (nvfp4lib.bench.moe_bench)
EP = DATA_DIR / "ep.jsonl"  # the MoE layer over several GPUs, per phase (nvfp4lib.bench.ep_bench, moe-bench --ep W)
GENERATE = DATA_DIR / "generate.jsonl"  # NVFP4 checkpoints decoded against bf16 (nvfp4lib.bench.generate_bench)
GATHER = DATA_DIR / "gather.jsonl"  # the one-shot gather alone per shape and knob (nvfp4lib.bench.gather_bench)
# bench rows of runs under a tuning cache that `nvfp4lib tune` filled (config="auto" ran its tuned choice, not the
# shipped rule's): kept apart from bench.jsonl, whose auto rows are the shipped rule's
TUNED = DATA_DIR / "tuned.jsonl"
PROFILES = DATA_DIR / "profiles.jsonl"  # what bounds a kernel: Nsight Compute's metrics per kernel (bench.ncu_profile)
# Where commands write their rows unless asked to record them: git-ignored, so running a command never
# dirties the checkout; data/ grows only by an explicit --record (or `record`).
SCRATCH_DIR = DATA_DIR.parent / "build"


def dirty_state(value) -> str:
    """A row's ``git_dirty`` for display: "yes", "no" or "unknown" (None or NaN: a run whose tree git could not read,
    as on the GPU machine, which records the commit it was given)."""
    if value is None or (isinstance(value, float) and value != value):
        return "unknown"
    return "yes" if bool(value) else "no"


def new_run_id() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:8]


def _json_default(o):
    if isinstance(o, (torch.dtype, torch.device, Path)):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"cannot store {type(o).__name__} in a results row")


def append_rows(path, rows: list[dict]) -> int:
    """Append ``rows`` to the JSON-lines file ``path`` in one write; never rewrites what is there."""
    if not rows:
        return 0
    for r in rows:
        if "run_id" not in r:
            raise ValueError("every stored row needs a run_id (rows of one run share it)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = "".join(json.dumps(r, default=_json_default, sort_keys=True) + "\n" for r in rows)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, blob.encode())
    finally:
        os.close(fd)
    return len(rows)


def read_rows(path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{i}: not a JSON row ({e})") from None
    return rows


# Every bench row names the kernel family that measured it (``kernel_family``) and the config it ran (``config``:
# the one ``auto`` chose, where it chose). A peer is its own family (its backend name) and has no config. The rows
# measured before these fields existed got them once, by ``tools/migrate_kernel_family.py`` (their previous state is
# in each row's ``amended`` list). ``cute-hopper`` has had three kernels; the family names the code that ran:
FAMILIES = {  # family -> (the `kernel` column's name, where its code is)
    "hopper_bf16_decode": ("bf16-decode (v1, removed)", "nvfp4lib/kernels/sm90.py, removed in 111ecc9: "
                           "git show 111ecc9^:nvfp4lib/kernels/sm90.py"),
    "hopper_smem": ("fp16-decode", "nvfp4lib/kernels/hopper_smem/ (decode into shared memory)"),
    "hopper_rs": ("swap-AB register decode", "nvfp4lib/kernels/hopper_rs/ (rs_* configs)"),
    "hopper_varlen": ("device-scheduled swap-AB", "nvfp4lib/kernels/hopper_varlen/ (the serving path)"),
    "blackwell": ("blackwell", "nvfp4lib/kernels/blackwell/"),
}
HOPPER_KERNELS = tuple(FAMILIES[f][0] for f in ("hopper_bf16_decode", "hopper_smem", "hopper_rs"))
_KERNEL_OF_FAMILY = {f: FAMILIES[f][0] for f in ("hopper_bf16_decode", "hopper_smem", "hopper_rs", "hopper_varlen")}


def kernel_family(backend: str, config: str | None) -> str:
    """The family that runs ``config`` of ``backend`` in this tree, asked when a row is measured (never guessed
    later): cute-hopper with no config, ``auto`` or a ``vl_*`` config is the serving kernel (``hopper_varlen``);
    ``study-auto`` chooses among ``rs_*`` configs; a study config's class names its family (``hopper_smem`` or
    ``hopper_rs``)."""
    if backend == "cute-blackwell":
        return "blackwell"
    if backend != "cute-hopper":
        return backend
    if config in (None, "auto") or str(config).startswith("vl_"):
        return "hopper_varlen"
    if config == "study-auto":
        return "hopper_rs"
    from ..kernels.hopper_smem import kernel as hopper

    cfg = {**hopper.CONFIGS, **getattr(hopper, "SWEEP_CONFIGS", {})}.get(config)
    if cfg is None:
        return f"cute-hopper (config {config!r} not resolved)"
    return cfg.family  # each family's config class names it


def load(path=BENCH):
    """The table as a pandas DataFrame (empty if the file does not exist yet), with a derived ``kernel`` column
    naming the cute-hopper kernel of each row, read from its ``kernel_family`` (None for other families)."""
    import pandas as pd

    rows = read_rows(path)
    df = pd.DataFrame(rows)
    if len(df):
        df["kernel"] = [_KERNEL_OF_FAMILY.get(r.get("kernel_family")) for r in rows]
    return df


def latest_compile_rows(arch: str):
    """The most recent compile report for ``arch`` (e.g. "sm_100a": compiled here, not run)."""
    rows = load(COMPILE)
    if not len(rows):
        return rows
    rows = rows[rows["arch"] == arch]
    return rows[rows["run_id"] == sorted(rows["run_id"].unique())[-1]] if len(rows) else rows


# Top-level folders a copy of the checkout may leave out and still run a commit's code: the rendered figures (plots
# and notebook HTML, ~10 MB) are outputs, and leaving them out keeps the GPU machine's copy under its size limit;
# the recorded data (~15 MB) is read by the study, not by a measurement. Tried in this order after the whole tree.
OMIT_SETS = (("figures",), ("figures", "data"))
OMITTABLE = OMIT_SETS[-1]


def resolve_commits(rows: list[dict]) -> list[dict]:
    """Rows whose ``git_commit`` is unknown or dirty but whose ``git_tree`` is a commit's tree in this repository get
    that commit (``git_dirty`` False): the GPU machine's copy of the checkout has a stale ``.git``, but the tree it
    ran is the commit's, byte for byte. A tree equal to a commit's tree without the folders of one of
    :data:`OMIT_SETS` is that commit's code too: the row gets the commit and says what its copy left out
    (``git_tree_omits``)."""
    found: dict = {}
    for r in rows:
        tree = r.get("git_tree")
        if tree and (r.get("git_dirty") or r.get("git_commit") in (None, "unknown")):
            if tree not in found:
                found[tree] = next(((c, list(omit)) for omit in ((), *OMIT_SETS)
                                    if (c := commit_of_tree(tree, omit=omit))), (None, []))
            commit, omits = found[tree]
            if commit:
                r["git_commit"], r["git_dirty"] = commit, False
                if omits:
                    r["git_tree_omits"] = omits
    return rows


def merge(src, dst=BENCH) -> int:
    """Append to ``dst`` the rows of ``src`` whose run_id ``dst`` does not hold yet (e.g. rows
    measured on the GPU machine and brought back), their commits resolved from their trees
    (:func:`resolve_commits`). Returns the number of rows appended."""
    have = {r.get("run_id") for r in read_rows(dst)}
    new = resolve_commits([r for r in read_rows(src) if r.get("run_id") not in have])
    for r in new:
        if not r.get("gpu"):
            raise ValueError(f"{src}: row without a 'gpu' provenance field; refusing to store it")
        if {"backend", "options"} <= set(r) and not {"kernel_family", "config"} <= set(r):  # a bench row
            raise ValueError(f"{src}: a {r['backend']} row without 'kernel_family' and 'config' (measured by an older "
                             "tree?); refusing to store it: rows say what made them")
    return append_rows(dst, new)


def amend(path, run_ids, reason: str, **fields) -> int:
    """Correct provenance fields of whole runs, keeping every old value: a row's previous values go to
    ``amended[i]`` with the reason and the date. Measurements themselves are never amended."""
    protected = {"median_us", "min_us", "p10_us", "p90_us", "rel_err", "status", "problem", "label", "run_id"}
    if protected & set(fields):
        raise ValueError(f"measurements cannot be amended: {sorted(protected & set(fields))}")
    path = Path(path)
    rows = read_rows(path)
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    n = 0
    for r in rows:
        if r.get("run_id") in run_ids:
            old = {k: r.get(k) for k in fields}
            r.setdefault("amended", []).append({"date": now, "reason": reason, "previous": old})
            r.update(fields)
            n += 1
    _rewrite(path, rows)
    return n


def _rewrite(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` over ``path`` atomically (a temporary file, then a rename)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True, default=_json_default) + "\n")
    os.replace(tmp, path)


def add_fields(path, values, reason: str) -> int:
    """Give rows fields they lack, explicitly, keeping the record: ``values(row)`` returns the fields to add (or
    {}); a row's previous values of those fields go to ``amended[i]`` with the reason and the date. Fields a row
    already has and measurements are never touched. Returns the number of rows changed."""
    protected = {"median_us", "min_us", "p10_us", "p90_us", "rel_err", "status", "problem", "label", "run_id"}
    path = Path(path)
    rows = read_rows(path)
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    n = 0
    for r in rows:
        new = {k: v for k, v in values(r).items() if k not in r}
        if protected & set(new):
            raise ValueError(f"measurements cannot be added afterwards: {sorted(protected & set(new))}")
        if new:
            r.setdefault("amended", []).append({"date": now, "reason": reason, "previous": dict.fromkeys(new)})
            r.update(new)
            n += 1
    if not n:
        return 0
    _rewrite(path, rows)
    return n


def _git(*args) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=DATA_DIR.parent, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    except Exception:
        return None


def _version(dist: str, module: str | None = None) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
    if module:
        try:
            mod = __import__(module)
            return getattr(mod, "__version__", "installed (version unknown)")
        except Exception:
            return None
    return None


def _nvidia_smi() -> dict:
    fields = ["driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
              "power.limit", "temperature.gpu"]
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        vals = [v.strip() for v in out.splitlines()[0].split(",")]
        return {("smi_" + k.replace(".", "_")): v for k, v in zip(fields, vals)}
    except Exception as e:  # no nvidia-smi: say so rather than guess
        return {"smi_error": type(e).__name__}


def working_tree_id() -> str | None:
    """Git's id of the tree the working copy holds now (tracked and untracked, ignored files left out), hashed with a
    temporary index: it names the code that ran even where ``.git`` is stale (a copied working tree, as on the GPU
    machine) and equals a commit's tree exactly when the code is that commit's."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
        try:
            subprocess.run(["git", "add", "-A", "."], cwd=DATA_DIR.parent, env=env, capture_output=True, timeout=60,
                           check=True)
            return subprocess.run(["git", "write-tree"], cwd=DATA_DIR.parent, env=env, capture_output=True, text=True,
                                  timeout=60, check=True).stdout.strip() or None
        except Exception:
            return None


def tree_without(tree: str, omit) -> str | None:
    """Git's id of ``tree`` with its top-level entries named in ``omit`` left out, hashed as git hashes a tree object
    (entries in ``git ls-tree`` order, which is git's; nothing is written to the repository)."""
    import hashlib

    listing = _git("ls-tree", "-z", tree)
    if listing is None:
        return None
    body = b""
    for entry in filter(None, listing.split("\0")):
        meta, name = entry.split("\t", 1)
        mode, _, sha = meta.split(" ")
        if name not in omit:
            body += f"{mode.lstrip('0')} {name}".encode() + b"\0" + bytes.fromhex(sha)
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def commit_of_tree(tree: str | None, omit=(), newest: int = 400) -> str | None:
    """The newest commit of this repository whose tree is ``tree`` (None if none is); with ``omit``, whose tree
    without those top-level folders is ``tree`` (among the ``newest`` commits: one ``git mktree`` each)."""
    if not tree:
        return None
    out = _git("log", "--all", "--format=%H %T")
    for i, line in enumerate((out or "").splitlines()):
        commit, _, t = line.partition(" ")
        if t == tree or (omit and i < newest and tree_without(t, omit) == tree):
            return commit
    return None


def provenance(device=None) -> dict:
    """Where and with what a measurement is taken.

    The code is named by git, never by hand: ``git_tree`` is the working copy's tree id (:func:`working_tree_id`);
    ``git_commit`` is the commit with that tree (HEAD's, or found in the history), and ``git_dirty`` says whether the
    working copy differs from every commit. Where the commit is not in this clone's history (a stale ``.git`` on the
    GPU machine), ``git_commit`` is "unknown" until :func:`resolve_commits` finds it in the checkout that records
    the rows."""
    tree = working_tree_id()
    head = _git("rev-parse", "HEAD")
    commit = head if tree and head and _git("rev-parse", "HEAD^{tree}") == tree else commit_of_tree(tree)
    p = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "git_commit": commit or "unknown",
        "git_dirty": None if tree is None else commit is None,
        "git_tree": tree,
        "git_head": head,  # HEAD of the .git beside the code (stale on the GPU machine's copy)
        "torch": torch.__version__,
        "triton": _version("triton", "triton"),
        "cutlass_dsl": cutlass_dsl_version(),
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        dev = torch.device(device or "cuda")
        props = torch.cuda.get_device_properties(dev)
        p.update({
            "gpu": props.name,
            "sm": f"sm_{props.major}{props.minor}",
            "sm_count": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", None),
            "cuda": torch.version.cuda,
            **_nvidia_smi(),
        })
    else:
        p["gpu"] = "none (CPU)"
    return p
