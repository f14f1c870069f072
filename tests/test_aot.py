"""Kernels built ahead of time (nvfp4lib/kernels/common/aot.py), on the CPU: recipes and their digests, the manifest,
the loader's fallbacks, the build into shared libraries that export the TVM-FFI function, and the same PTX as the
GPU machine's compile. Loading one on a GPU: tests/gpu/test_aot_gpu.py."""
import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from nvfp4lib.kernels.common import aot, pdl
from nvfp4lib.kernels.hopper_rs import ops as rs_ops
from nvfp4lib.kernels.hopper_varlen import config, kernel, runner

GEMM = config.CONFIGS["vl_a16_dual_m64_t16_k128_s8_e"]


def _recipe(**change):
    r = runner._recipe("varlen-gemm", GEMM, 16, 256, 256, "BFloat16", k=256)
    return {**r, **change}


def test_a_recipe_names_the_kernel_and_the_knobs_its_build_reads(monkeypatch):
    r = _recipe()
    assert r == {"kind": "varlen-gemm", "config": GEMM.name, "groups": 16, "n": 256, "k_pad": 256, "out": "BFloat16",
                 "k": 256, "chain": True, "chain_gemm": True, "prewait": kernel.PREWAIT_STAGES,
                 "handoff": kernel.TILE_HANDOFF, "a16_int_scale": rs_ops.A16_INT_SCALE,
                 "a16_own_words": rs_ops.A16_OWN_WORDS, "chain_gemm_a16": pdl.CHAIN_GEMM_A16,
                 "early_descriptors": kernel.EARLY_DESCRIPTORS, "raw_scale": kernel.RAW_SCALE,
                 "handoff_wait": kernel.HANDOFF_WAIT, "slice_barrier_all": kernel.SLICE_BARRIER_ALL,
                 "ablation": kernel.ABLATION}
    assert aot.digest(r) == aot.digest(dict(reversed(list(r.items()))))  # key order does not matter
    assert len({aot.digest(r), aot.digest(_recipe(n=512)), aot.digest(_recipe(prewait=0)),
                aot.digest(_recipe(chain=False)), aot.digest(_recipe(handoff=not kernel.TILE_HANDOFF)),
                aot.digest(_recipe(a16_int_scale=not rs_ops.A16_INT_SCALE)),
                aot.digest(_recipe(a16_own_words=not rs_ops.A16_OWN_WORDS)),
                aot.digest(_recipe(early_descriptors=not kernel.EARLY_DESCRIPTORS)),
                aot.digest(_recipe(raw_scale=not kernel.RAW_SCALE)),
                aot.digest(_recipe(handoff_wait=not kernel.HANDOFF_WAIT)),
                aot.digest(_recipe(slice_barrier_all=not kernel.SLICE_BARRIER_ALL)),
                aot.digest(_recipe(ablation="no_mma"))}) == 12
    assert runner._recipe("varlen-gemm", GEMM.with_(ab_stages=7), 16, 256, 256, "BFloat16") is None  # not in CONFIGS
    monkeypatch.setattr(kernel, "TIMELINE", 1 << 40)  # an address baked into the kernel: never built ahead
    assert runner._recipe("varlen-gemm", GEMM, 16, 256, 256, "BFloat16") is None


def test_the_manifest_holds_each_recipe_once(tmp_path, monkeypatch):
    manifest = tmp_path / "m.jsonl"
    monkeypatch.setenv(aot.RECORD_ENV, str(manifest))
    monkeypatch.setattr(aot, "_NOTED", set())
    for r in (_recipe(), _recipe(), None, _recipe(n=512)):
        aot.note(r)
    assert aot.read_manifest(manifest) == [_recipe(), _recipe(n=512)]
    manifest.write_text(manifest.read_text() + json.dumps(_recipe()) + "\n")  # another process noted it again
    assert len(aot.read_manifest(manifest)) == 2


def test_the_shipped_manifest_names_kernels_this_code_builds():
    """tools/aot-manifest.jsonl (recipes a GPU run compiled, and some written by hand): every recipe has the keys a
    runner's recipe has, a known kind, and a config this code still names, with the groups, N and padded K a kernel
    of that config takes."""
    path = os.path.join(os.path.dirname(__file__), "..", "tools", "aot-manifest.jsonl")
    recipes = aot.read_manifest(path)
    assert len(recipes) >= 100
    keys = set(_recipe())
    for r in recipes:
        assert keys - {"k"} <= set(r), r
        assert r["kind"] in ("varlen-gemm", "varlen-call", "varlen-combine"), r
        cfg = config.CONFIGS[r["config"]]
        if r["kind"] == "varlen-combine":  # (a single GEMM's, with the token rows' dtype)
            assert not cfg.dual and r["combine_out"] in ("Float16", "BFloat16", "Float32") and r["top_k"] > 0, r
        assert r["groups"] > 0 and r["n"] > 0 and r["k_pad"] % cfg.tile_k == 0, r


def test_load_falls_back_to_compiling(tmp_path, monkeypatch):
    """No directory set: None, silently; no library there: None with a warning naming the kernel (a run shows what it
    compiled); a library that does not load: None with a warning."""
    monkeypatch.delenv(aot.AOT_ENV, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert aot.load(_recipe()) is None
    monkeypatch.setenv(aot.AOT_ENV, str(tmp_path))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert aot.load(_recipe()) is None and aot.load(None) is None
    assert len(got) == 1 and "not in" in str(got[0].message) and _recipe()["config"] in str(got[0].message)
    pytest.importorskip("cutlass")
    (tmp_path / f"{aot.digest(_recipe())}.so").write_bytes(b"not a library")
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert aot.load(_recipe()) is None
    assert any("compiling instead" in str(w.message) for w in got)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "nvfp4lib", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_build_links_libraries_that_export_the_kernel(tmp_path):
    """`python -m nvfp4lib aot` on a manifest (no GPU): one library per recipe, exporting the TVM-FFI function under
    its digest and needing CuTe DSL's runtime and libtvm_ffi; a second build keeps them."""
    pytest.importorskip("cutlass")
    pytest.importorskip("tvm_ffi")
    if not (shutil.which("cc") and shutil.which("readelf")):
        pytest.skip("needs cc and readelf")
    manifest = tmp_path / "m.jsonl"
    recipes = [_recipe(), runner._recipe("varlen-call", config.CONFIGS["vl_m128_t16_k128_s8_e_x"], 16, 256, 256,
                                         "BFloat16", fused=False)]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in recipes))
    out = _cli("aot", str(manifest), "--out", str(tmp_path / "lib"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "built 2, kept 0" in out.stdout
    for r in recipes:
        lib = tmp_path / "lib" / f"{aot.digest(r)}.so"
        syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True).stdout
        assert f"__tvm_ffi_{aot.digest(r)}" in syms
        assert "__cute_internal" not in syms  # only the TVM-FFI symbols are visible: libraries never clash
        deps = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
        assert "libcuda_dialect_runtime.so" in deps and "libtvm_ffi.so" in deps
    again = _cli("aot", str(manifest), "--out", str(tmp_path / "lib"))
    assert "built 0, kept 2" in again.stdout


@pytest.mark.slow
def test_the_build_compiles_the_ptx_the_gpu_machine_compiles(tmp_path):
    """A recipe compiled as the build does (CUTE_DSL_ARCH other than the target: no JIT engine) and as the GPU
    machine does (CUTE_DSL_ARCH=sm_90a) gives the same PTX."""
    pytest.importorskip("cutlass")
    code = ("import json, sys\nfrom nvfp4lib.kernels.hopper_varlen import runner\n"
            "try:\n    runner.aot_compile(json.loads(sys.argv[1]), '--gpu-arch sm_90a --keep-ptx --dump-dir ' "
            "+ sys.argv[2])\nexcept Exception:\n    pass\n")
    ptx = []
    for arch in ("sm_90a", "sm_100a"):
        d = tmp_path / arch
        d.mkdir()
        subprocess.run([sys.executable, "-c", code, json.dumps(_recipe()), str(d)], capture_output=True, timeout=600,
                       env={**os.environ, "CUTE_DSL_ARCH": arch}, check=False)
        files = sorted(d.glob("*.sm_90a.ptx"))
        assert files, arch
        ptx.append(files[-1].read_text())
    assert ptx[0] == ptx[1]


def test_the_build_knobs_are_read_once_for_the_key_and_the_recipe(monkeypatch):
    """runner.BUILD_KNOBS: the one list of module knobs a build reads; a recipe carries each as it is now."""
    knobs = runner.build_knobs()
    assert set(knobs) == {f for f, _, _ in runner.BUILD_KNOBS} and {f: _recipe()[f] for f in knobs} == knobs
    monkeypatch.setattr(kernel, "PREWAIT_STAGES", 0)
    assert runner.build_knobs()["prewait"] == 0 and _recipe()["prewait"] == 0


def test_build_setting_sets_build_knobs_by_recipe_field_and_restores_them():
    """``runner.build_setting`` (bench's ``--backend cute-hopper:handoff=0``): the knobs by their recipe fields inside
    the block, as they were after it (after an error too); an unknown field is refused before anything is set."""
    before = runner.build_knobs()
    with runner.build_setting(handoff=not kernel.TILE_HANDOFF, prewait=0):
        assert kernel.TILE_HANDOFF is (not before["handoff"]) and kernel.PREWAIT_STAGES == 0
        assert _recipe()["handoff"] is (not before["handoff"])  # (the recipe and the compile key follow)
    assert runner.build_knobs() == before
    with pytest.raises(RuntimeError), runner.build_setting(chain=False):
        raise RuntimeError("inside")
    assert runner.build_knobs() == before
    with pytest.raises(ValueError, match="unknown build knob"), runner.build_setting(handof=False):
        pass
    assert runner.build_knobs() == before
