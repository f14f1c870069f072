"""Ahead-of-time CuTe DSL kernels: compiled on a machine without a GPU, loaded where one runs.

Compiling dominates a GPU session (every process compiles each kernel it launches, a few seconds each). CuTe DSL can
compile for sm_90a with no GPU and export the TVM-FFI function it builds to an object file (``export_to_c``); linked
into a shared library, it loads on the GPU machine (``cutlass.cute.runtime.load_module``) and is called like the JIT
function. This module does that for the kernels the runners compile, by *recipe*: a small JSON-able dict that names
what to build (the runner's kind, config name, shapes and the knobs its build reads).

- A process with ``NVFP4LIB_AOT_RECORD=FILE`` appends each recipe it compiles to FILE (the manifest, one JSON per line);
- ``python -m nvfp4lib aot FILE --out DIR`` builds every recipe of a manifest on any machine (no GPU) into DIR, one
  ``<digest>.so`` each;
- a process with ``NVFP4LIB_AOT=DIR`` loads a recipe's library from DIR instead of compiling it, where it is there.

A library's name is a digest of its recipe, the CuTe DSL version and the source of ``nvfp4lib/kernels``: after any
change to the kernels' code, the old libraries are not found (never loaded stale) and the kernels compile as before.
Where loading fails the kernel compiles as before, with a warning.

On an H200 (2026-11-28): ``tests/gpu/test_aot_gpu.py`` passed (a layer recorded, its manifest built on the GPU
machine's CPU, every kernel loaded in a new process, the bits equal eager and graphed). Libraries built here without a
GPU were carried there for the serving GPU tests and a benchmark process per shape (3-5 configs each, the
host-scheduled kernel's compiled there: 10-40 s a process); neither logged how many it loaded. The serving tests ran
no faster (44 tests in 330 s, against 57 in 466 s compiling), so either they are not compile-bound or their workers did
not load the libraries: not known yet.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import warnings
from pathlib import Path

from .compiling import cutlass_dsl_version

__all__ = ["AOT_ENV", "RECORD_ENV", "LOADED", "digest", "load", "note", "build", "read_manifest"]

AOT_ENV = "NVFP4LIB_AOT"  # a directory of built libraries to load from
RECORD_ENV = "NVFP4LIB_AOT_RECORD"  # a manifest file to append compiled recipes to
GPU_ARCH = "sm_90a"
_KERNELS = Path(__file__).resolve().parents[1]  # nvfp4lib/kernels
_SOURCE: list[str] = []
LOADED: list[str] = []  # the libraries this process loaded (their digests), in order


def _source_digest() -> str:
    """sha256 of every .py file under nvfp4lib/kernels (paths and contents), computed once per process."""
    if not _SOURCE:
        h = hashlib.sha256()
        for p in sorted(_KERNELS.rglob("*.py")):
            h.update(str(p.relative_to(_KERNELS)).encode())
            h.update(p.read_bytes())
        _SOURCE.append(h.hexdigest())
    return _SOURCE[0]


def digest(recipe: dict) -> str:
    """The library name of ``recipe``: its JSON, the CuTe DSL version and the kernels' source, hashed."""
    h = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode())
    h.update(str(cutlass_dsl_version()).encode())
    h.update(_source_digest().encode())
    return "k" + h.hexdigest()[:32]


def note(recipe: dict | None) -> None:
    """Append ``recipe`` to the manifest named by :data:`RECORD_ENV`, where it is set (once per recipe and process)."""
    path = os.environ.get(RECORD_ENV)
    if not path or recipe is None:
        return
    name = digest(recipe)
    if name in _NOTED:
        return
    _NOTED.add(name)
    with open(path, "a") as f:
        f.write(json.dumps(recipe, sort_keys=True) + "\n")


_NOTED: set[str] = set()
_MODULES: list = []


def load(recipe: dict | None):
    """The function of ``recipe``'s library in the directory :data:`AOT_ENV` names, or None (not set, not built there,
    or not loadable: then with a warning naming why)."""
    where = os.environ.get(AOT_ENV)
    if not where or recipe is None:
        return None
    name = digest(recipe)
    lib = Path(where) / f"{name}.so"
    if not lib.exists():  # (said, so that a run shows what it compiled: a stale or partial build)
        warnings.warn(f"{AOT_ENV}: {lib.name} ({recipe.get('kind')} {recipe.get('config')}, {recipe.get('groups')} "
                      f"groups, n {recipe.get('n')}, k {recipe.get('k_pad')}) not in {where}; compiling",
                      RuntimeWarning, stacklevel=2)
        return None
    try:
        from cutlass.cute.runtime import load_module

        mod = load_module(str(lib))
        fn = mod[name]
    except Exception as e:  # noqa: BLE001  (any failure: compile as before)
        warnings.warn(f"{AOT_ENV}: could not load {lib.name} ({type(e).__name__}: {e}); compiling instead",
                      RuntimeWarning, stacklevel=2)
        return None
    LOADED.append(name)
    _MODULES.append(mod)  # (kept loaded for the process: its kernels may be captured in graphs)
    return fn


def read_manifest(path) -> list[dict]:
    """The distinct recipes of a manifest file, in first-seen order."""
    seen, out = set(), []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            name = digest(r)
            if name not in seen:
                seen.add(name)
                out.append(r)
    return out


def _libraries() -> tuple[Path, Path]:
    """The directories of CuTe DSL's runtime library and of libtvm_ffi, to link against."""
    import cutlass
    import tvm_ffi

    dsl = Path(cutlass.__file__).resolve().parents[2] / "lib"
    if not (dsl / "libcuda_dialect_runtime.so").exists():
        raise FileNotFoundError(f"libcuda_dialect_runtime.so not in {dsl}")
    return dsl, Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent


def build(recipes: list[dict], out_dir, compile_recipe, *, progress=print) -> list[dict]:
    """Compile each recipe for :data:`GPU_ARCH` with ``compile_recipe(recipe, options)`` (the runner's:
    :func:`nvfp4lib.kernels.hopper_varlen.runner.aot_compile`) and link it into ``out_dir/<digest>.so`` (one already
    there is kept).
    Runs without a GPU. The process must import cutlass with ``CUTE_DSL_ARCH`` other than :data:`GPU_ARCH` (no JIT
    engine, which needs a driver, is made then): :func:`nvfp4lib.study.cli`'s ``aot`` command sets it. Returns one
    status dict per recipe."""
    if os.environ.get("CUTE_DSL_ARCH", "") == GPU_ARCH:
        raise RuntimeError(f"aot.build: set CUTE_DSL_ARCH to another arch than {GPU_ARCH} before cutlass is imported "
                           "(the compile then makes no JIT engine, which needs a GPU driver)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dsl, tvm = _libraries()
    status = []
    for r in recipes:
        name = digest(r)
        lib = out / f"{name}.so"
        if lib.exists():
            status.append({"recipe": r, "library": lib.name, "status": "kept"})
            continue
        t0 = time.time()
        fn = compile_recipe(r, f"--gpu-arch {GPU_ARCH}")
        o = out / f"{name}.o"
        fn.export_to_c(str(o), function_name=name, export_only_tvm_ffi_symbols=True)
        subprocess.run(["cc", "-shared", "-o", str(lib), str(o), f"-L{dsl}", "-lcuda_dialect_runtime", f"-L{tvm}",
                        "-ltvm_ffi"], check=True, capture_output=True)
        o.unlink()
        status.append({"recipe": r, "library": lib.name, "status": "built", "seconds": round(time.time() - t0, 1)})
        if progress:
            progress(f"  {lib.name}  {r.get('kind')} {r.get('config')}  {time.time() - t0:.1f} s")
    return status
