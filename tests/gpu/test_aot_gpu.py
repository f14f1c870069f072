"""Kernels built ahead of time (nvfp4lib/kernels/common/aot.py) on a Hopper GPU (skipped without one): a process that
records its kernels, the build of that manifest (on this machine's CPU, no JIT engine), and a process that loads the
libraries instead of compiling gives the recording process's outputs bit for bit, eager and in a CUDA graph."""
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

# one process: build a small layer, run it eagerly at T = 1 and 64 and once in a graph, save the outputs; print how
# many libraries it loaded
_RUN = """
import sys, torch
from nvfp4lib.bench.moe_bench import _graph_of
from nvfp4lib.kernels.common import aot
from nvfp4lib.nn import NVFP4MoE
g = torch.Generator().manual_seed(3)
w = [(torch.randn(16, *s, generator=g) * 0.05).to(torch.bfloat16).cuda() for s in ((128, 256), (128, 256), (256, 128))]
outs = []
for mode in ("nvfp4", "bf16"):
    layer = NVFP4MoE.from_float(*w, activations=mode)
    for t in (1, 64):
        x = torch.randn(t, 256, generator=g).to(torch.bfloat16).cuda()
        ids = torch.stack([torch.randperm(16, generator=g)[:2] for _ in range(t)]).cuda()
        tw = torch.softmax(torch.randn(t, 2, generator=g), -1).cuda()
        outs.append(layer(x, ids, tw))
        graph, out = _graph_of(layer, x.clone(), ids.clone(), tw.clone())
        graph.replay()
        torch.cuda.synchronize()
        outs.append(out.clone())
torch.save([o.cpu() for o in outs], sys.argv[1])
print("loaded", len(aot.LOADED))
"""


def _run(env: dict, path, cwd):
    out = subprocess.run([sys.executable, "-c", _RUN, str(path)], capture_output=True, text=True, timeout=900,
                         env={**os.environ, **env}, cwd=cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return int(out.stdout.split("loaded")[-1])


def test_libraries_built_ahead_give_the_compiled_kernels_bits(tmp_path):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs sm_90")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    manifest, lib = tmp_path / "m.jsonl", tmp_path / "lib"
    assert _run({"NVFP4LIB_AOT_RECORD": str(manifest)}, tmp_path / "jit.pt", root) == 0
    build = subprocess.run([sys.executable, "-m", "nvfp4lib", "aot", str(manifest), "--out", str(lib)],
                           capture_output=True, text=True, timeout=900, cwd=root,
                           env={k: v for k, v in os.environ.items() if k != "CUTE_DSL_ARCH"})
    assert build.returncode == 0, build.stderr[-3000:]
    n = len(manifest.read_text().splitlines())
    assert n >= 4 and len(list(lib.glob("*.so"))) == n  # (each mode's gate/up and down GEMMs at least)
    assert _run({"NVFP4LIB_AOT": str(lib)}, tmp_path / "aot.pt", root) == n  # every kernel loaded, none compiled
    for a, b in zip(torch.load(tmp_path / "jit.pt"), torch.load(tmp_path / "aot.pt")):
        assert torch.equal(a, b)
