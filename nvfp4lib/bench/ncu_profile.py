"""What bounds a kernel, from Nsight Compute, as rows with provenance (``python -m nvfp4lib ncu``).

``ncu`` runs around any command of the package (a ``bench`` or ``moe-bench`` process), on the kernels whose names
match ``--kernel``, one launch each for ``--count`` launches, with every section (``--set full``) and clocks left as
the card runs them (``--clock-control none``). Its report is read back through two pages, ``details`` and the SASS
``source`` page, into one row per profiled kernel (:func:`profile_rows`):

- the details' headline metrics (:data:`DETAILS`), converted to one unit each (µs, MHz, GB/s, KB, %);
- from the source page, the executed warp instructions by opcode (``opcodes``: share of all, the top
  :data:`TOP_OPCODES`), the warp-stall samples by reason (``stalls``: share of all samples), and where they fall:
  by opcode (``stall_ops``: the :data:`TOP_SITES` opcodes holding the most samples, each ``[share, its main reason,
  that reason's share of the opcode's samples]``) and by instruction (``stall_sites``: the :data:`TOP_SITES` SASS
  lines holding the most, each ``[offset from the kernel's first instruction, the line, share, main reason]``), so a
  row says not only why the warps wait but at which instruction: a barrier wait, a load's consumer, a wgmma wait.

ncu replays each kernel alone (its start does not overlap the kernel before, as a programmatic dependent launch does
in a CUDA graph) with the caches flushed, so ``duration_us`` is the kernel's own time, not what a call pays: the rows
say *why* a kernel takes its time; the benches say how long a call takes. Needs a GPU and ``ncu`` on the PATH; the
parsing needs neither (tests/test_ncu_profile.py).
"""
from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

__all__ = ["DETAILS", "TOP_OPCODES", "parse_details", "parse_source", "profile_rows", "run_ncu", "add_command"]

# row field -> the details page's metric name; a name that comes with two units (Memory Throughput: % and byte/s)
# is told apart by its unit (_FIELD_BY_UNIT)
DETAILS = {
    "duration_us": "Duration", "cycles": "Elapsed Cycles", "sm_active_cycles": "SM Active Cycles",
    "sm_mhz": "SM Frequency", "dram_pct": "DRAM Throughput", "sm_pct": "Compute (SM) Throughput",
    "l2_hit_pct": "L2 Hit Rate", "issue_busy_pct": "Issue Slots Busy", "ipc_active": "Issued Ipc Active",
    "warps_active": "Active Warps Per Scheduler", "warps_eligible": "Eligible Warps Per Scheduler",
    "no_eligible_pct": "No Eligible", "cycles_per_issue": "Warp Cycles Per Issued Instruction",
    "occupancy_pct": "Achieved Occupancy", "registers": "Registers Per Thread", "grid": "Grid Size",
    "block": "Block Size", "smem_kb": "Dynamic Shared Memory Per Block", "instructions": "Executed Instructions",
}
_FIELD_BY_UNIT = {("Memory Throughput", "%"): "mem_pct", ("Memory Throughput", "GB/s"): "mem_gbps"}
TOP_OPCODES = 24  # (rows of 2026-11-29 hold 12)
TOP_SITES = 12  # opcodes and SASS lines kept in stall_ops and stall_sites (rows before 2026-11-29 have neither)
# unit -> (the unit a row keeps, factor); matched without case
_UNITS = {
    "ns": ("us", 1e-3), "us": ("us", 1.0), "usecond": ("us", 1.0), "ms": ("us", 1e3), "msecond": ("us", 1e3),
    "nsecond": ("us", 1e-3), "hz": ("MHz", 1e-6), "khz": ("MHz", 1e-3), "mhz": ("MHz", 1.0), "ghz": ("MHz", 1e3),
    "cycle/nsecond": ("MHz", 1e3), "cycle/usecond": ("MHz", 1.0), "byte/s": ("GB/s", 1e-9),
    "kbyte/s": ("GB/s", 1e-6), "mbyte/s": ("GB/s", 1e-3), "gbyte/s": ("GB/s", 1.0), "tbyte/s": ("GB/s", 1e3),
    "byte/block": ("KB", 1e-3), "kbyte/block": ("KB", 1.0), "mbyte/block": ("KB", 1e3),
}
_KERNEL_CLASS = re.compile(r"([A-Z][A-Za-z0-9]*Sm(?:90|100)[A-Za-z0-9]*)")
# a SASS line's opcode and its first modifier ("HGMMA.64x16x16": opcodes count the opcode, stall_ops both)
_OPCODE = re.compile(r"^(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_]+)?")


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _convert(value: float, unit: str) -> tuple[float, str]:
    to, factor = _UNITS.get(unit.strip().lower(), (unit.strip(), 1.0))
    return value * factor, to


def kernel_class(name: str) -> str:
    """The kernel's class from its mangled name (CuTe DSL names a kernel after its class), else the name cut short."""
    m = _KERNEL_CLASS.search(name)
    return m.group(1) if m else name[:60]


def parse_details(text: str) -> list[dict]:
    """One dict per profiled kernel (in the report's order) of the details page's CSV: ``kernel`` (its class),
    ``kernel_id`` and the :data:`DETAILS` fields found."""
    by_name = {v: k for k, v in DETAILS.items()}
    out: dict[str, dict] = {}
    for r in csv.DictReader(io.StringIO(text)):
        kid = r.get("ID")
        if kid is None or not r.get("Metric Name"):
            continue
        row = out.setdefault(kid, {"kernel_id": int(kid), "kernel": kernel_class(r.get("Kernel Name", ""))})
        value = _number(r.get("Metric Value", ""))
        if value is None:
            continue
        value, unit = _convert(value, r.get("Metric Unit", ""))
        name = r["Metric Name"]
        field = _FIELD_BY_UNIT.get((name, unit)) or by_name.get(name)
        if field and field not in row:  # (a metric shown in two sections: the first)
            row[field] = value
    return list(out.values())


def _blocks(text: str) -> list[list[str]]:
    """The source page's CSV split per kernel: each block starts with a "Kernel Name" line, then its own header."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    return blocks


def parse_source(text: str) -> list[dict]:
    """One dict per kernel of the SASS source page's CSV, in the report's order: ``sass_instructions`` (warp
    instructions executed), ``opcodes`` (the top :data:`TOP_OPCODES` opcodes' shares of them), ``stall_samples`` and
    ``stalls`` (each reason's share of the warp-stall samples), ``stall_ops`` and ``stall_sites`` (where the samples
    fall, the module doc)."""
    out = []
    for block in _blocks(text):
        rows = list(csv.DictReader(io.StringIO("\n".join(block))))
        ops, stalls = Counter(), Counter()
        reasons = [c for c in (rows[0] if rows else {}) if c.startswith("stall_") and "Not Issued" not in c]
        by_op: dict[str, Counter] = {}
        sites = []  # (samples, offset, line, reasons)
        first = None
        for r in rows:
            src = r.get("Source", "").strip()
            m = _OPCODE.match(src)
            executed = _number(r.get("Instructions Executed", "")) or 0.0
            if m and executed:
                ops[m.group(1)] += executed
            here = Counter({c[len("stall_"):]: _number(r[c]) or 0.0 for c in reasons})
            stalls.update(here)
            addr = _address(r.get("Address", ""))
            first = addr if first is None else first
            if sum(here.values()) and m:
                by_op.setdefault(m.group(1) + (m.group(2) or ""), Counter()).update(here)
                sites.append((sum(here.values()), (addr or 0) - (first or 0), " ".join(src.split())[:80], here))
        total, samples = sum(ops.values()), sum(stalls.values())
        out.append({
            "sass_instructions": total,
            "opcodes": {o: round(v / total, 4) for o, v in ops.most_common(TOP_OPCODES)} if total else {},
            "stall_samples": samples,
            "stalls": {s: round(v / samples, 4) for s, v in stalls.most_common() if v} if samples else {},
            **(_stall_places(by_op, sites, samples) if samples else {}),
        })
    return out


def _address(text: str) -> int | None:
    try:
        return int(text, 16)
    except ValueError:
        return None


def _stall_places(by_op: dict, sites: list, samples: float) -> dict:
    """``stall_ops`` and ``stall_sites`` (:func:`parse_source`) of one kernel's samples."""
    def main(c: Counter) -> tuple[str, float]:
        reason, n = c.most_common(1)[0]
        return reason, round(n / sum(c.values()), 3)

    top_ops = sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:TOP_SITES]
    top_sites = sorted(sites, key=lambda s: -s[0])[:TOP_SITES]
    return {
        "stall_ops": {op: [round(sum(c.values()) / samples, 4), *main(c)] for op, c in top_ops},
        "stall_sites": [[off, line, round(n / samples, 4), main(c)[0]] for n, off, line, c in top_sites],
    }


def profile_rows(details: str, source: str | None = None, **labels) -> list[dict]:
    """The rows of one report: :func:`parse_details` merged, kernel by kernel, with :func:`parse_source` (where
    given; the two pages list the kernels in one order), each with ``labels``."""
    rows = parse_details(details)
    extra = parse_source(source) if source else []
    if extra and len(extra) != len(rows):
        raise ValueError(f"the details page lists {len(rows)} kernels and the source page {len(extra)}")
    return [{**labels, **r, **(extra[i] if extra else {})} for i, r in enumerate(rows)]


NCU_OPTIONS = ("--set", "full", "--import-source", "yes", "--clock-control", "none", "-f")


def _ncu(*args: str) -> str:
    return subprocess.run(["ncu", *args], check=True, capture_output=True, text=True).stdout


def run_ncu(command: list[str], kernel: str, count: int = 1, skip: int = 0, report: Path | None = None) -> tuple:
    """Profile ``python -m nvfp4lib COMMAND...`` under ncu: launches ``skip`` .. ``skip + count - 1`` of the kernels
    whose names match the regular expression ``kernel``. Returns (details CSV, source CSV, ncu's version line)."""
    if shutil.which("ncu") is None:
        raise RuntimeError("ncu (Nsight Compute's command line) is not on the PATH: it comes with the CUDA toolkit")
    with tempfile.TemporaryDirectory() as tmp:
        rep = Path(report or Path(tmp) / "profile.ncu-rep")
        proc = subprocess.run(["ncu", *NCU_OPTIONS, "--kernel-name", f"regex:{kernel}", "--launch-skip", str(skip),
                               "--launch-count", str(count), "-o", str(rep.with_suffix("")),
                               sys.executable, "-m", "nvfp4lib", *command], capture_output=True, text=True)
        if proc.returncode or not rep.exists():
            raise RuntimeError(f"ncu failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
        details = _ncu("-i", str(rep), "--page", "details", "--csv")
        source = _ncu("-i", str(rep), "--page", "source", "--csv", "--print-source", "sass")
        version = _ncu("--version").strip().splitlines()[-1]
    return details, source, version


def cmd_ncu(args, write) -> int:
    from .store import new_run_id, provenance

    command = [c for i, c in enumerate(args.command) if c != "--" or i]  # (argparse may keep the first --)
    if not command:
        raise SystemExit("ncu: give the profiled command after --, e.g. -- bench --problem S4 --iters 3 --no-record")
    bad = [kv for kv in args.label or [] if "=" not in kv]
    if bad:
        raise SystemExit(f"ncu: --label takes KEY=VALUE, got {bad[0]!r}")
    labels = dict(kv.split("=", 1) for kv in args.label or [])
    details, source, version = run_ncu(command, args.kernel, args.count, args.skip, args.report)
    base = {**provenance(), "run_id": new_run_id(), "ncu": version, "ncu_options": " ".join(NCU_OPTIONS),
            "profiled": " ".join(command), "kernel_regex": args.kernel}
    rows = [{**base, **r} for r in profile_rows(details, source, **labels)]
    for r in rows:
        top = ", ".join(f"{k} {v:.0%}" for k, v in list(r.get("stalls", {}).items())[:3])
        print(f"{r['kernel']:<28} {r.get('duration_us', float('nan')):8.1f} us  issue "
              f"{r.get('issue_busy_pct', 0):5.1f}%  DRAM {r.get('dram_pct', 0):5.1f}%  stalls: {top}")
    write(args, rows, "profiles.jsonl")
    return 0 if rows else 1


def add_command(sub, add_record_args, write) -> None:
    """``python -m nvfp4lib ncu``: the parser and the command, registered on ``sub`` (argparse subparsers)."""
    from .store import PROFILES

    p = sub.add_parser("ncu", help="profile a command's kernels under Nsight Compute; one row per kernel (GPU, ncu)")
    p.add_argument("--kernel", required=True, help="regular expression of the kernel names to profile")
    p.add_argument("--count", type=int, default=1, help="launches profiled (default 1)")
    p.add_argument("--skip", type=int, default=0, help="matching launches skipped first")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="a field every row carries (repeatable)")
    p.add_argument("--report", type=Path, help="keep ncu's report here (default: a temporary file)")
    p.add_argument("command", nargs="*", help="-- then the nvfp4lib command to profile")
    add_record_args(p, PROFILES, "profile")
    p.set_defaults(fn=lambda args: cmd_ncu(args, write))
