"""Reading ``data/moe.jsonl`` by commit for notebook 11's rounds (:mod:`.moe_rounds`): a :class:`Round`, the
:class:`Reader`, which remembers the runs it read, and the readers of a knob's A/B that several rounds share (one run
at a commit with the knob set both ways; the arms in the order they ran; a commit against the one before)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from ..bench.moe_bench import LABELS

__all__ = ["Round", "in_turn", "NOT_RECORDED", "NO_PREDICTION", "W4A4", "W4A16", "PEER", "SHORT", "KEY", "Reader",
           "span", "per_label", "speedups", "ab_at", "gemm_us", "shipped_rule", "split_ab", "not_probe",
           "timed_in_order", "arms_in_order", "arm_means_at", "rounds_table_of", "generic", "profile_kernels",
           "gemm_phases", "timeline_phases"]

NOT_RECORDED = "not recorded in data/"
NO_PREDICTION = "none written down"
W4A4, W4A16, PEER = LABELS["nvfp4"], LABELS["bf16"], LABELS["peer"]
SHORT = {W4A4: "W4A4", W4A16: "W4A16", PEER: "bf16"}
KEY = ["layer", "tokens", "routing", "label"]


@dataclass(frozen=True)
class Round:
    """One development round: ``change`` (what the code does differently), ``prediction`` (as written before the
    measurement; a callable computes it from the floors alone; empty: none was written), ``commits`` (the commits
    whose recorded runs measured the outcome), ``outcome`` (computed from a :class:`Reader`; None or a result of
    None: the data hold nothing for it), ``unrecorded`` (what was measured only outside data/)."""

    change: str
    prediction: str | Callable[[], str]
    commits: tuple[str, ...]
    outcome: Callable[["Reader"], str | None] | None = None
    unrecorded: str = ""


def in_turn(outcomes, sep: str = "; then "):
    """One round's outcome from several runs' (each a Reader -> str | None): those the data hold, in order."""
    return lambda r: sep.join(x for x in (o(r) for o in outcomes) if x) or None


class Reader:
    """The ok rows of ``data/moe.jsonl``, read by commit; the runs each read used are kept in ``used``."""

    def __init__(self, rows: pd.DataFrame):
        ok = rows[rows["status"] == "ok"] if len(rows) and "status" in rows else pd.DataFrame(columns=[*KEY, "run_id"])
        self.all = rows  # (every row, whatever its status: a round may count the cases that went wrong)
        self.rows = ok.assign(commit=ok["git_commit"].astype(str).str[:7]) if len(ok) else ok
        self.used: dict[str, list[str]] = {}

    def at(self, commit: str, *, layers=None, tokens=None, routing: str | None = "uniform") -> pd.DataFrame:
        """The latest ok row of each case measured at ``commit`` (several runs at one commit count together),
        narrowed to ``layers``, ``tokens`` (a collection or a predicate) and ``routing`` (None: both)."""
        if not len(self.rows):
            return self.rows
        sel = self.rows[self.rows["commit"] == commit[:7]]
        if layers is not None:
            sel = sel[sel["layer"].isin(layers)]
        if tokens is not None:
            sel = sel[sel["tokens"].map(tokens).astype(bool) if callable(tokens) else sel["tokens"].isin(tokens)]
        if routing is not None:
            sel = sel[sel["routing"] == routing]
        sel = sel.sort_values("run_id").groupby(KEY, sort=False).tail(1)
        for run in sorted(set(sel["run_id"])):
            self.used.setdefault(commit[:7], [])
            if run not in self.used[commit[:7]]:
                self.used[commit[:7]].append(run)
        return sel

    def pair(self, before: str, after: str, col: str = "median_us", **narrow) -> pd.DataFrame:
        """The cases measured at both commits: ``before`` and ``after`` values of ``col``; empty if either lacks
        them."""
        a, b = self.at(before, **narrow), self.at(after, **narrow)
        if not len(a) or not len(b) or col not in a or col not in b:
            return pd.DataFrame(columns=[*KEY, "before", "after"])
        m = a[[*KEY, col]].merge(b[[*KEY, col]], on=KEY, suffixes=("_a", "_b"))
        return m.rename(columns={f"{col}_a": "before", f"{col}_b": "after"}).dropna(subset=["before", "after"])


def span(values, fmt: str = "{:.2f}") -> str:
    v = sorted(float(x) for x in values if pd.notna(x))
    if not v:
        return "—"
    lo, hi = fmt.format(v[0]), fmt.format(v[-1])
    return lo if lo == hi else f"{lo} to {hi}"


def per_label(df: pd.DataFrame, value: Callable[[pd.DataFrame], pd.Series], fmt: str, labels=(W4A4, W4A16, PEER),
               names: dict | None = None) -> str:
    names = names or {}
    parts = [f"{names.get(lab, SHORT[lab])} {span(value(df[df['label'] == lab]), fmt)}" for lab in labels
             if (df["label"] == lab).any()]
    return ", ".join(parts)


def speedups(df: pd.DataFrame, labels=(W4A4, W4A16)) -> str:
    """bf16 layer time over each mode's, per case of ``df``, as ranges."""
    p = df[df["label"] == PEER].set_index(["layer", "tokens", "routing"])["median_us"]
    parts = []
    for lab in labels:
        m = df[df["label"] == lab].set_index(["layer", "tokens", "routing"])["median_us"]
        if len(m):
            parts.append(f"bf16 / {SHORT[lab]} {span((p / m).dropna())}x")
    return ", ".join(parts) if parts else "—"


def ab_at(r: Reader, commit: str, column: str, keep=None, values=(False, True)):
    """An A/B in one run at ``commit``, uniform routing: (its rows, those with ``column`` equal to ``values[0]``, those
    with it equal to ``values[1]``: the latest per case, indexed by case), ``keep`` narrowing the rows first; None
    where the data hold no such rows."""
    d = r.rows[(r.rows["commit"] == commit[:7]) & (r.rows["routing"] == "uniform")] if len(r.rows) else r.rows
    if not len(d) or column not in d:
        return None
    d = d[keep(d)] if keep is not None else d
    d = d.sort_values("run_id")
    off, on = (d[d[column].eq(v)].groupby(KEY).tail(1).set_index(KEY) for v in values)
    return d[d[column].isin(values)], off, on


def gemm_us(profile) -> list[float]:
    """The serving kernel's GEMM times in a row's graph-replay profile (CuTe DSL kernels, not the prologue), in
    launch order."""
    if not isinstance(profile, dict):
        return []
    return [k["median_us"] for k in profile.get("kernels", []) if str(k.get("name", "")).startswith("kernel_cutlass")
            and "tensorptrf16" not in str(k.get("name", ""))]


def chain_steps(profile) -> list[tuple[str, float]]:
    """(kernel, us from the previous kernel's end to its own end) of a row's graph-replay profile, in launch order
    (the first from the replay's start): what each link of a layer's launch chain adds."""
    if not isinstance(profile, dict):
        return []
    out, prev = [], 0.0
    for k in profile.get("kernels", []):
        end = k["start_us"] + k["median_us"]
        out.append((str(k.get("name", "")).split("(")[0], end - prev))
        prev = end
    return out


def shipped_rule(d: pd.DataFrame) -> pd.Series:
    """The rows of the split rule shipped when the split-K on/off A/Bs ran ("idle"), and the rows with split-K off
    (rows from before the rule knob: all)."""
    if "split_rule" not in d:
        return pd.Series(True, index=d.index)
    return d["split_rule"].isna() | d["split_rule"].eq("idle") | d["split_k"].eq(False)


def split_ab(commit: str, column: str = "split_k", values=(False, True), keep=shipped_rule,
              names=("split-K off", "on")):
    """The split-K A/B at one commit: rows with ``split_k`` on against off (moe-bench --split-k off on), per case;
    or, with ``column="split_rule"``, one rule against another (--split-k idle balance)."""
    def outcome(r: Reader) -> str | None:
        ab = ab_at(r, commit, column, keep=keep, values=values)
        if ab is None:
            return None
        d, off, on = ab
        both = pd.concat({"off": off["median_us"], "on": on["median_us"]}, axis=1).dropna()
        if not len(both):
            return None
        r.used[commit[:7]] = sorted(set(d["run_id"]))
        moved = both[(both["on"] - both["off"]).abs() > 0.05 * both["off"]]
        cases = "; ".join(f"{k[0]} T = {k[1]} {SHORT.get(k[3], k[3])} {v['off']:.1f} -> {v['on']:.1f} us"
                          for k, v in moved.iterrows())
        gemms = []
        if "profile" in d:
            for k in both.index:
                a, b = (gemm_us(x.at[k, "profile"]) for x in (off, on))
                if a and b:
                    gemms.append(f"{k[0]} T = {k[1]} {SHORT.get(k[3], k[3])} "
                                 + ", ".join(f"{x:.1f} -> {y:.1f}" for x, y in zip(a, b)))
        return (f"{names[0]} -> {names[1]}, one run at {commit[:7]}, uniform, graph replay, {len(both)} cases; "
                f"moved by more than 5%: {cases or 'none'}; the rest within 5%"
                + (f". The serving kernel's GEMMs (gate/up, down; us, each row's profile): {'; '.join(gemms)}"
                   if gemms else ""))
    return outcome


def not_probe(d: pd.DataFrame) -> pd.Series:
    """The rows of a timed run, not of a timeline probe (whose GEMMs stamp)."""
    if "timeline" not in d:
        return pd.Series(True, index=d.index)
    return d["timeline"].map(lambda v: not isinstance(v, dict))


def timed_in_order(r: Reader, commit: str, columns) -> pd.DataFrame | None:
    """The timed rows (no timeline probe) at ``commit`` in the order they ran (the runs marked used), or None where
    there are none or they lack one of ``columns``."""
    d = r.rows[r.rows["commit"] == commit[:7]] if len(r.rows) else r.rows
    if not len(d) or not set(columns) <= set(d.columns):
        return None
    d = d[not_probe(d)].sort_values("run_id", kind="stable")
    r.used[commit[:7]] = sorted(set(d["run_id"]))
    return d


def arms_in_order(commit: str, column: str, labels: dict):
    """An A/B whose arms ran several times in one process (moe-bench --knob off on off on): per case (both
    routings), each arm's times in the order they ran, and the kernel that moved most in the graph-replay profile."""
    def outcome(r: Reader) -> str | None:
        d = timed_in_order(r, commit, (column,))
        if d is None:
            return None
        parts = []
        for key, g in d.groupby(["layer", "tokens", "routing", "label"], sort=False):
            arms = " then ".join(f"{labels.get(v, v)} {x:.1f}" for v, x in zip(g[column], g["median_us"]))
            parts.append(f"{key[0]} T = {key[1]} {key[2]} {SHORT.get(key[3], key[3])}: {arms} us")
        return "graph replay, in the order the arms ran: " + "; ".join(parts)
    return outcome


def _gemm_means(d: pd.DataFrame, keys: list) -> dict:
    """Per ``keys`` (a case and an arm), each GEMM's mean time in the rows' graph-replay profiles (rows without one:
    none)."""
    if "profile" not in d:
        return {}
    out = {}
    for k, g in d[d["profile"].map(lambda p: isinstance(p, dict))].groupby(keys, sort=False):
        times = [gemm_us(p) for p in g["profile"]]
        out[k] = [sum(t[i] for t in times) / len(times) for i in range(min(map(len, times)))]
    return out


def arm_means_at(commit: str, column: str, names: tuple[str, str], mode: str, values: tuple = (0, 1), keep=None):
    """An on/off knob's A/B at ``commit`` (moe-bench --knob 0 1 ...; ``values``: the column's off and on values) in
    ``mode``'s rows (the column set; ``keep``: a filter of the rows, e.g. the A/B's profiled rows where a run as
    shipped at the same commit holds the on value too), over the cases both arms ran: per case, each arm's mean graph
    time over its runs, the ratio on / off, the bf16 peer's time where the run has it, and the GEMMs' mean times where
    the rows hold profiles (moe-bench --profile)."""
    def outcome(r: Reader) -> str | None:
        d = timed_in_order(r, commit, (column,))
        if d is None:
            return None
        peer = d[d["mode"] == "bf16-weights"].groupby(["layer", "tokens", "routing"])["median_us"].mean()
        d = d[d[column].notna()]  # (another mode's run at the same commit is not the A/B's)
        d = d[keep(d)] if keep is not None else d
        if not len(d):
            return None
        r.used[commit] = sorted(set(d["run_id"]))  # (the peer's rows are in the same runs)
        arms = d.groupby(["layer", "tokens", "routing", "label", column], sort=False)["median_us"].mean().unstack()
        if not set(values) <= set(arms.columns):
            return None
        arms = arms.reindex(columns=list(values)).dropna()  # (by label: bool values are not a mask)
        ratio = arms[values[1]] / arms[values[0]]
        gemms = _gemm_means(d, ["layer", "tokens", "routing", "label", column])

        def profiled(k) -> str:
            off, on = gemms.get((*k, values[0])), gemms.get((*k, values[1]))
            return (f" (its GEMMs {' + '.join(f'{x:.1f}' for x in off)} -> {' + '.join(f'{x:.1f}' for x in on)} us"
                    " in the profile)") if off and on else ""
        cases = "; ".join(f"{k[0]} T = {k[1]} {k[2]} {SHORT.get(k[3], k[3])} {v.iloc[0]:.1f} -> {v.iloc[1]:.1f} us"
                          + (f" (bf16 peer {peer[k[:3]]:.1f})" if k[:3] in peer.index else "") + profiled(k)
                          for k, v in arms.iterrows())
        return (f"{names[0]} -> {names[1]}, {mode}, graph replay, each arm's mean over its runs ({len(arms)} cases, "
                f"ratio {span(ratio)}): {cases}")
    return outcome


def generic(before: str | None, after: str):
    """A commit no round names: its rows against the previous commit's, the same cases (both routings)."""
    def outcome(r: Reader) -> str | None:
        if before is None:
            return None
        p = r.pair(before, after, routing=None)
        if not len(p):
            return None
        return (f"{before} -> {after}, {len(p)} cases, graph time before / after: "
                + per_label(p, lambda g: g["before"] / g["after"], "{:.2f}x"))
    return outcome


def _not_ok_note(rows: pd.DataFrame, commits: tuple[str, ...]) -> str:
    if not len(rows) or "status" not in rows:
        return ""
    bad = rows[(rows["git_commit"].astype(str).str[:7].isin(commits)) & (rows["status"] != "ok")]
    if not len(bad):
        return ""
    parts = []
    for lab, g in bad.groupby("label", sort=False):
        kind = str(g["status"].iloc[0]).split(":")[:2]
        parts.append(f"{SHORT.get(lab, lab)} not ok in {len(g)} cases ({':'.join(kind).strip()})")
    return "; ".join(parts)


def rounds_table_of(rows: pd.DataFrame, rounds) -> pd.DataFrame:
    """One line per round (then per commit of the data no round names): change, prediction, outcome (computed from
    the rows; :data:`NOT_RECORDED` where the data hold nothing for it), the commits and the runs it read."""
    r = Reader(rows if rows is not None else pd.DataFrame())
    out = []
    named = {c for x in rounds for c in x.commits}
    for i, rd in enumerate(rounds, 1):
        r.used = {}
        text = rd.outcome(r) if rd.outcome else None
        note = _not_ok_note(rows, rd.commits) if rows is not None else ""
        parts = [text or NOT_RECORDED] + ([note] if note else []) + (
            [f"{rd.unrecorded}: {NOT_RECORDED}"] if rd.unrecorded else [])
        pred = rd.prediction() if callable(rd.prediction) else rd.prediction
        runs = [run for c in rd.commits for run in r.used.get(c, [])]
        out.append({"round": i, "change": rd.change, "prediction": pred or NO_PREDICTION,
                    "outcome (from data/moe.jsonl)": "; ".join(parts), "commit": ", ".join(rd.commits),
                    "runs": ", ".join(runs) or NOT_RECORDED})
    if len(r.rows):
        order = r.rows.groupby("commit")["run_id"].max().sort_values().index.tolist()
        for j, c in enumerate(order):
            if c in named:
                continue
            r.used = {}
            text = generic(order[j - 1] if j else None, c)(r)
            out.append({"round": len(out) + 1, "change": "no round written for this commit yet",
                        "prediction": NO_PREDICTION, "outcome (from data/moe.jsonl)": text or NOT_RECORDED,
                        "commit": c, "runs": ", ".join(r.used.get(c, [])) or NOT_RECORDED})
    return pd.DataFrame(out).set_index("round")


def profile_kernels(row) -> str:
    """A row's graph-replay kernels as name: duration (us), in launch order."""
    prof = row.get("profile") if isinstance(row, dict) else row["profile"]
    if not isinstance(prof, dict):
        return ""
    names = []
    for k in prof.get("kernels", []):
        n = str(k.get("name", ""))
        n = "GEMM" if n.startswith("kernel_cutlass") else n.strip("_").replace("_kernel", "")
        names.append(f"{n} {k['median_us']:.1f}")
    return ", ".join(names)


def gemm_phases(row):
    """(GEMM, CTAs with a tile, phases) of each GEMM of a timeline row that has phases, in GEMMS' order."""
    from ..bench.timeline import GEMMS

    tl = row["timeline"] if isinstance(row["timeline"], dict) else {}
    for gemm in GEMMS:
        ph = (tl.get(gemm) or {}).get("phases") or {}
        if ph:
            yield gemm, tl[gemm]["tiles"], ph


def timeline_phases(row) -> str:
    """A timeline row's per-GEMM phases (median us per CTA)."""
    from ..bench.timeline import PHASES

    return "; ".join(f"{gemm} " + ", ".join(f"{k} {ph[k][0]:.2f}" for k, _, _ in PHASES if k in ph)
                     for gemm, _, ph in gemm_phases(row))
