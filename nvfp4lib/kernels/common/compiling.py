"""Compiling CuTe DSL kernels without a GPU, and reading what the compiler made.

CuTe DSL 4.3.5 compiles for any target on a machine with no driver: it writes the
.ptx/.cubin, then raises ``DSLRuntimeError`` when it tries to load the module. We
catch exactly that error (and the ``RuntimeError("Unknown function ...")`` that later
compiles in the same process raise instead), and only once the artifacts exist. ``ptxas -v`` on the
kept PTX gives registers, spills and static shared memory.
"""
from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ARCHS = ("sm_90a", "sm_100a")
# Instructions whose presence a kernel claims; counted in the PTX.
KEY_INSTRUCTIONS = (
    "wgmma.mma_async",
    "cp.async.bulk.tensor",
    "tcgen05.mma",
    "tcgen05.ld",
    "tcgen05.cp",
    "stmatrix",
    "ldmatrix",
    "mbarrier.try_wait",
)


@dataclass
class CompileArtifacts:
    arch: str
    ptx_path: str | None
    cubin_path: str | None
    loaded: object | None = None  # the compiled callable when a driver loaded it
    load_error: str = ""
    instructions: dict = field(default_factory=dict)
    ptxas: dict = field(default_factory=dict)

    @property
    def ptx(self) -> str:
        return read_ptx(self.ptx_path) if self.ptx_path else ""


def cutlass_dsl_version() -> str | None:
    """The CuTe DSL version: its installed metadata, or (the GPU machine gets CuTe DSL as an unpacked wheel on
    PYTHONPATH, no installed metadata) the wheel's dist-info folder beside the package; None without CuTe DSL."""
    from importlib import metadata

    try:
        return metadata.version("nvidia-cutlass-dsl")
    except metadata.PackageNotFoundError:
        pass
    try:
        import cutlass
    except Exception:  # noqa: BLE001  (not importable: no version)
        return None
    root = Path(cutlass.__file__).resolve().parents[3]
    for d in sorted(root.glob("nvidia_cutlass_dsl-*.dist-info")):
        return d.name.removesuffix(".dist-info").split("-")[1]
    return "installed (version unknown)"


def read_ptx(path: str) -> str:
    # The kept PTX ends with NUL padding that ptxas rejects.
    with open(path, "rb") as f:
        return f.read().rstrip(b"\x00").decode("utf-8", errors="replace")


def ptx_digest(ptx: str) -> str:
    """sha256 (16 hex digits) of the PTX without its ``.loc``/``.file`` lines and comments: equal digests mean the
    same device code whatever file and line the source came from (how a refactor shows it changed no kernel)."""
    body = "\n".join(line for line in ptx.splitlines() if not line.lstrip().startswith((".loc", ".file", "//")))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def count_instructions(ptx: str, names=KEY_INSTRUCTIONS) -> dict:
    counts = {n: len(re.findall(r"\b" + re.escape(n), ptx)) for n in names}
    kinds = sorted(set(re.findall(r"tcgen05\.mma\S*kind::(\w+)", ptx)))
    if kinds:
        counts["tcgen05.mma kinds"] = ",".join(kinds)
    return counts


def ptxas_resources(ptx_path: str, arch: str) -> dict:
    """Registers, spills and static shared memory per kernel, from ``ptxas -v``."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        return {"ptxas": "not found"}
    with tempfile.TemporaryDirectory() as tmp:
        clean = os.path.join(tmp, "k.ptx")
        with open(clean, "w") as f:
            f.write(read_ptx(ptx_path))
        proc = subprocess.run(
            [ptxas, f"-arch={arch}", "-v", clean, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True, text=True, timeout=600,
        )
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return {"ptxas_error": log.strip()[-2000:]}
    out = {}
    m = re.search(r"Used (\d+) registers", log)
    out["registers"] = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    out["spill_stores"], out["spill_loads"] = (int(m.group(1)), int(m.group(2))) if m else (None, None)
    m = re.search(r"(\d+) bytes stack frame", log)
    out["stack_frame"] = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes smem", log)
    out["static_smem"] = int(m.group(1)) if m else 0
    out["ptxas_log"] = log.strip()[-1500:]
    return out


# SASS opcodes worth counting in a Hopper GEMM with an in-kernel decode (cuobjdump -sass; on the GPU machine)
SASS_OPS = ("HGMMA", "PRMT", "LOP3", "HMUL2", "HFMA2", "F2FP", "LDS", "STS", "LDL", "STL", "BAR", "SYNCS",
            "UTMALDG", "UTMASTG", "WARPGROUP")


def sass_counts(cubin_path: str) -> dict:
    """Static SASS opcode counts of a cubin (``cuobjdump -sass``); {"sass": "..."} saying why when unavailable."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return {"sass": "cuobjdump not found (the SASS is read on the GPU machine)"}
    proc = subprocess.run([tool, "-sass", cubin_path], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return {"sass": f"cuobjdump failed: {proc.stderr.strip()[-300:]}"}
    line = r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)"  # "/*1a0*/  @!P0 OPCODE.mods ..."
    ops = [m.group(1) for m in re.finditer(line, proc.stdout, re.M)]
    out = {"sass": "ok", "sass.instructions": len(ops)}
    out.update({f"sass.{op}": sum(1 for o in ops if o == op) for op in SASS_OPS})
    return out


def compile_offline(jit_fn, *args, arch: str, dump_dir: str | None = None, ptxas: bool = True,
                    extra_options: str = "", **kwargs) -> CompileArtifacts:
    """``cute.compile`` for ``arch`` keeping PTX and cubin; tolerate only the no-driver load error.
    ``extra_options`` are appended to the compile options (e.g. ``--enable-tvm-ffi``)."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    import cutlass.cute as cute
    from cutlass.base_dsl.common import DSLRuntimeError

    dump_dir = dump_dir or tempfile.mkdtemp(prefix=f"nvfp4lib-{arch}-")
    os.makedirs(dump_dir, exist_ok=True)
    start = time.time() - 1.0  # artifacts written by this compile (a reused dump_dir may hold older ones)
    opts = f"--keep-ptx --keep-cubin --gpu-arch {arch} --dump-dir {dump_dir} {extra_options}".strip()
    loaded, load_error = None, ""
    try:
        loaded = cute.compile(jit_fn, *args, options=opts, **kwargs)
    except DSLRuntimeError as e:
        load_error = str(e)
    except RuntimeError as e:  # later no-driver compiles in the same process fail to resolve the kernel instead
        if "Unknown function" not in str(e):
            raise
        load_error = str(e)
    new = sorted((p for p in glob.glob(os.path.join(dump_dir, "*")) if os.path.getmtime(p) >= start),
                 key=os.path.getmtime)
    ptx = [p for p in new if p.endswith(f".{arch}.ptx")]
    cubin = [p for p in new if p.endswith(f".{arch}.cubin")]
    if load_error and not (ptx and cubin):
        # Not the tolerated "compiled, could not load" case: a real compile error.
        raise RuntimeError(f"CuTe DSL failed to compile for {arch}: {load_error[-3000:]}")
    art = CompileArtifacts(arch, ptx[-1] if ptx else None, cubin[-1] if cubin else None,
                           loaded=loaded, load_error=load_error[:300])
    if art.ptx_path:
        art.instructions = {**count_instructions(art.ptx), "ptx_sha256": ptx_digest(art.ptx)}
        if ptxas:
            art.ptxas = ptxas_resources(art.ptx_path, arch)
    if art.cubin_path and shutil.which("cuobjdump"):
        art.instructions.update(sass_counts(art.cubin_path))
    return art
