"""One-off migration (issue 19): the development logs of ``wip/`` become rows of ``data/history.jsonl``.

``wip/`` held the GPU logs of the optimisation rounds (the register-decode kernel's rounds 2-31 and the fp16-decode
kernel's first runs); notebook 09 quoted and parsed them. This script read each log once, from the git tree of the
last commit that still had ``wip/`` (``--source``), and wrote one row per measurement with its provenance:

* ``git_commit``: the commit that added the log. Its tree holds the code and the script that wrote the log
  (``git show <git_commit>:nvfp4lib/kernels/hopper_rs.py`` reproduces the kernel that was measured);
  ``commit_reported``: what the GPU copy reported as its commit (``wip/rs/COMMIT`` at that commit), where it did;
* ``date``: that commit's author date (no log carries a date of its own);
* ``gpu``: the log's own ``device:`` line, or the GPU its file name states (``..._H200.log``); else None
  ("not recorded in the log"): nothing is assumed;
* ``source_log``, ``script`` (the round's script at that commit, if any) and ``kind``:
  ``dev check`` (``nvfp4lib check`` lines), ``profile span`` (torch.profiler kernel-time sums over graph replays
  with the L2 flushed, ``wip/rs/profile.py``), ``timeline`` (per-CTA ``%globaltimer`` stamps, median CTA),
  ``dev bench`` (CUDA-event times of graph replays, L2 flushed, ``wip/rs/diag*.py``), ``k sweep``, ``launch``
  (direct call vs graph replay), ``gpu tests`` (pytest summary) and ``fp16 dev run`` (the fp16-decode kernel's
  own script, eager and graph times).

Run once: ``python tools/migrate_wip_logs.py`` (refuses to append a log twice). Nothing is measured here; every
number is the log's. The ncu report ``round7_ncu_S4.txt`` is not migrated (its text stays at its commit).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "history.jsonl"
SOURCE = "f7c5079"  # the last commit whose tree has wip/
NOT_MIGRATED = {"wip/rs/gpu_logs/round7_ncu_S4.txt": "an Nsight Compute report, text only"}

_CHECK = re.compile(r"^(ok|FAIL)\s+(\S+)\s+(\S+)\s+(\w+)\s+seed=(\d+)\s+rel_err\s+(\S+)")
_PROFILE = re.compile(r"^(\S+)\s+(\S+)\s+sum=\s*([\d.]+) us\s+(?:span=\s*([\d.]+) us\s+)?(.*)$")
_SECTION = re.compile(r"^(S\d+(?:-dual)?) (\S+?)(?:_timeline)?: (.+?)(?: \(graph\))?$")
_POINT = re.compile(r"^\s+(\w+)\s+min\s+(\S+)\s+med\s+(\S+)\s+max\s+(\S+) us")
_DEV = re.compile(r"^(S\d(?:-dual)?)\s+(\S+)\s+(?:(\S+=\S+|\S+=\(.*?\))\s+)?([\d.]+) us\s+rel_err\s+(\S+)")
_KSWEEP = re.compile(r"^(\S+)\s+K=(\d+)\s+ktiles=(\d+)\s+full=\s*([\d.]+) gemm_alone=\s*([\d.]+) "
                     r"prologue_alone=\s*([\d.]+) us")
_LAUNCH = re.compile(r"^(\S+)\s+(\S+)\s+direct\s+([\d.]+) us\s+graph\s+([\d.]+) us\s+"
                     r"\(cpu per direct call ([\d.]+) us, per replay ([\d.]+) us\)")
_TINY = re.compile(r"^tiny kernel: direct ([\d.]+) us, graph ([\d.]+) us, flush ([\d.]+) us")
_TINY_GRAPH = re.compile(r"^one tiny kernel graph: ([\d.]+) us")
_PYTEST = re.compile(r"^(\d+) passed(?:, (\d+) failed)?(?:, (\d+) deselected)?.* in ([\d.]+)s")
_FP16_CASE = re.compile(r"^(\S+)\s+max_err=(\S+) cases=(\d+) failures=(\d+)")
_FP16_TIME = re.compile(r"^time (\S+)\s+(\S+)\s+eager\s+([\d.]+) us\s+graph\s+([\d.]+) us\s+err (\S+)")


def _git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _num(v: str):
    try:
        return float(v)
    except ValueError:
        return v


def _knob(text: str | None) -> dict:
    """'act_smem=32768' -> {'act_smem': 32768}; 'act_smem,param_groups=(32768, 16)' -> both."""
    if not text:
        return {}
    keys, _, vals = text.partition("=")
    vals = [v.strip() for v in vals.strip("()").split(",")]
    keys = keys.split(",")
    return {k: (v == "True" if v in ("True", "False") else int(v) if v.lstrip("-").isdigit() else v)
            for k, v in zip(keys, vals)}


def parse(text: str) -> list[dict]:
    """The measurements of one log, one dict per measurement (kind and fields; no provenance)."""
    rows, section, knobs = [], None, {}
    for line in text.splitlines():
        if m := _CHECK.match(line):
            label = m.group(2)
            cfg = re.search(r"config=([^,\]]+)", label)
            rows.append({"kind": "dev check", "check": m.group(1), "label": label, "problem": m.group(3),
                         "input_mode": m.group(4), "seed": int(m.group(5)), "rel_err": float(m.group(6)),
                         "config": cfg.group(1) if cfg else None})
        elif m := _POINT.match(line):
            if section is not None:
                section["points"][m.group(1)] = [float(v) for v in m.group(2, 3, 4)]
        elif m := _PROFILE.match(line):
            parts = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", m.group(5))}
            rows.append({"kind": "profile span", "problem": m.group(1), "config": m.group(2),
                         "sum_us": float(m.group(3)), "span_us": float(m.group(4)) if m.group(4) else None,
                         "kernels_us": parts})
        elif m := _KSWEEP.match(line):
            rows.append({"kind": "k sweep", "problem": f"S4-K{m.group(2)}", "config": m.group(1),
                         "k": int(m.group(2)), "k_tiles": int(m.group(3)), "full_us": float(m.group(4)),
                         "gemm_alone_us": float(m.group(5)), "prologue_alone_us": float(m.group(6))})
        elif m := _LAUNCH.match(line):
            rows.append({"kind": "launch", "problem": m.group(1), "config": m.group(2),
                         "direct_us": float(m.group(3)), "graph_us": float(m.group(4)),
                         "cpu_direct_us": float(m.group(5)), "cpu_replay_us": float(m.group(6))})
        elif m := _TINY.match(line):
            rows.append({"kind": "launch", "problem": "tiny kernel", "config": None, "direct_us": float(m.group(1)),
                         "graph_us": float(m.group(2)), "flush_us": float(m.group(3))})
        elif m := _TINY_GRAPH.match(line):
            rows.append({"kind": "launch", "problem": "tiny kernel", "config": None, "graph_us": float(m.group(1))})
        elif m := _DEV.match(line):
            rows.append({"kind": "dev bench", "problem": m.group(1), "config": m.group(2), **_knob(m.group(3)),
                         "median_us": float(m.group(4)), "rel_err": float(m.group(5))})
        elif m := _PYTEST.match(line):
            rows.append({"kind": "gpu tests", "problem": None, "config": None, "passed": int(m.group(1)),
                         "failed": int(m.group(2) or 0), "deselected": int(m.group(3) or 0),
                         "seconds": float(m.group(4))})
        elif m := _FP16_CASE.match(line):
            rows.append({"kind": "dev check", "problem": "correctness suites", "config": m.group(1),
                         "max_rel_err": float(m.group(2)), "cases": int(m.group(3)), "failures": int(m.group(4))})
        elif m := _FP16_TIME.match(line):
            rows.append({"kind": "fp16 dev run", "problem": m.group(2), "config": m.group(1),
                         "eager_us": float(m.group(3)), "graph_us": float(m.group(4)), "rel_err": _num(m.group(5))})
        elif m := re.match(r"^ACT_SMEM (\d+)$", line):
            knobs = {"act_smem": int(m.group(1))}
        elif (m := _SECTION.match(line)) and not line.startswith(" "):
            section = {"kind": "timeline", "problem": m.group(1), "config": m.group(2), "section": m.group(3),
                       **knobs, "points": {}}
            rows.append(section)
    for r in rows:
        if r["kind"] == "timeline" and any(v < 0 for p in r["points"].values() for v in p):
            r["note"] = "some stamps were never written (negative times): not a measurement of those points"
    return rows


def provenance(path: str, source: str) -> dict:
    added = _git("log", "--diff-filter=A", "--format=%H %aI", source, "--", path).split()
    commit, date = added[-2], added[-1]
    text = _git("show", f"{source}:{path}")
    dev = re.search(r"^device: (.+?) \(\d+, \d+\)$", text, re.M)
    named = re.search(r"_(H100|H200|B200)\b", Path(path).stem)
    try:
        reported = _git("show", f"{commit}:wip/rs/COMMIT").strip() or None
    except subprocess.CalledProcessError:
        reported = None
    rnd = re.match(r"round(\d+)", Path(path).name)
    script = f"wip/rs/round{rnd.group(1)}.sh" if rnd else None
    if script and subprocess.run(["git", "cat-file", "-e", f"{commit}:{script}"], cwd=ROOT).returncode:
        script = None
    return {"git_commit": commit, "commit_reported": reported, "date": date,
            "date_rule": "author date of git_commit (the log holds no date)",
            "gpu": dev.group(1) if dev else (named.group(1) if named else None),
            "gpu_source": "log" if dev else ("log file name" if named else "not recorded in the log"),
            "source_log": path, "script": script, "round": int(rnd.group(1)) if rnd else None,
            "run_id": f"history-{commit[:7]}-{Path(path).stem}"}


def migrate(source: str = SOURCE, out: Path = OUT) -> dict:
    logs = [p for p in _git("ls-tree", "-r", "--name-only", source, "wip/").split()
            if "/gpu_logs/" in p and p not in NOT_MIGRATED]
    have = set()
    if out.exists():
        have = {json.loads(line)["source_log"] for line in out.read_text().splitlines() if line.strip()}
    counts, rows = {}, []
    for path in logs:
        if path in have:
            raise SystemExit(f"{path} is already in {out}: the migration runs once")
        prov = provenance(path, source)
        found = parse(_git("show", f"{source}:{path}"))
        counts[path] = len(found)
        rows.extend({**prov, **r} for r in found)
    with open(out, "a") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    return counts


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=SOURCE, help="a commit whose tree still has wip/")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    c = migrate(a.source, a.out)
    for p, n in c.items():
        print(f"{n:5d}  {p}")
    print(f"{sum(c.values())} rows from {len(c)} logs -> {a.out}; not migrated: {NOT_MIGRATED}")
    sys.exit(0)
