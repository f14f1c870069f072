"""Compile reports: compile kernel configs with fake tensors (no GPU) and tabulate the facts.

``python -m nvfp4lib compile`` writes the rows to build/ (to data/compile.jsonl with ``--record``); the round
notebooks read the recorded ones to test the study's register / shared-memory / instruction claims. It sits above
``kernels/`` (it stamps rows with the store's provenance; kernels import nothing of the store or the bench).
"""
from __future__ import annotations

import importlib

from ..bench.store import new_run_id, provenance

KERNEL_MODULES = {"sm_90a": "nvfp4lib.kernels.hopper_smem.kernel", "sm_100a": "nvfp4lib.kernels.blackwell.runner"}


def kernel_module(arch: str):
    if arch not in KERNEL_MODULES:
        raise ValueError(f"no kernel for arch {arch!r}; known: {', '.join(KERNEL_MODULES)}")
    return importlib.import_module(KERNEL_MODULES[arch])


def configs_for(arch: str, names=None, *, sweep: bool = False) -> list:
    mod = kernel_module(arch)
    table = dict(mod.CONFIGS)
    if sweep or names:  # a named config may be one of the study's sweep candidates
        table.update(getattr(mod, "SWEEP_CONFIGS", {}))
    if names:
        unknown = [n for n in names if n not in table]
        if unknown:
            raise ValueError(f"unknown {arch} config(s) {unknown}; known: {', '.join(sorted(table))}")
        return [table[n] for n in names]
    return list(table.values())


def compile_rows(arch: str, names=None, *, sweep: bool = False, dual: bool = False) -> list[dict]:
    """One row per (config, single/dual): the kernel's compile_report, or the refusal message."""
    mod = kernel_module(arch)
    run_id = new_run_id()
    prov = provenance()
    rows = []
    for cfg in configs_for(arch, names, sweep=sweep):
        for d in ([False, True] if dual else [cfg.dual]):
            c = cfg.with_(dual=d)
            try:
                rep = mod.compile_report(c, arch=arch)
            except ValueError as e:  # refused by the kernel's validity rules, before compiling
                rep = {"error": f"refused: {e}"}
            except RuntimeError as e:  # the compiler's own error
                rep = {"error": f"compiler: {str(e)[-800:]}"}
            rows.append({"run_id": run_id, **prov, "arch": arch, "config": cfg.name, "dual": d,
                         "shipped": cfg.name in mod.CONFIGS, **c.as_dict(), **rep})
    return rows
