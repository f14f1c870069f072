"""The one-shot gather (one Triton launch: weights packed, activation rows packed, offsets and global scales) matches
the torch forms bit for bit: Triton's interpreter on the CPU (skipped where Triton is missing; the GPU suite runs
it compiled through the one-shot calls, and runs this file compiled on the GPU)."""
import os

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1", allow_module_level=True)
if not torch.cuda.is_available() and tuple(int(v) for v in np.__version__.split(".")[:2]) >= (2, 4):
    # (Triton 3.6's interpreter turns a scalar load into a 1-element array, which NumPy 2.4 refuses as a loop bound)
    pytest.skip("Triton's interpreter here needs numpy < 2.4", allow_module_level=True)

from nvfp4lib.formats import quantize, swizzle_scales  # noqa: E402
from nvfp4lib.kernels.hopper_rs.layout import prepack_weights  # noqa: E402
from nvfp4lib.kernels.hopper_varlen.config import NWG  # noqa: E402
from nvfp4lib.kernels.hopper_varlen.gather import F, launch  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _pad(t, rows, cols):
    out = t.new_zeros((rows, cols))
    out[: t.shape[0], : t.shape[1]] = t
    return out


@pytest.mark.parametrize("dual,tile_m,n,k,ms", [(False, 128, 192, 160, [5, 0, 37]), (True, 64, 64, 128, [3, 9]),
                                                (True, 128, 136, 96, [0, 1])])
@pytest.mark.parametrize("swz", [False, True])
@pytest.mark.parametrize("kcu,prefetch,once,rows_first,whole", [
    (1, 0, 0, 0, 0), (6, 0, 0, 1, 0), (8, 0, 0, 0, 0), (1, 1, 0, 0, 0), (3, 1, 0, 0, 0), (1, 0, 1, 1, 0),
    (2, 1, 1, 0, 0), (8, 1, 1, 1, 0), (1, 1, 1, 1, 1), (2, 1, 1, 0, 1), (8, 1, 1, 1, 1)])
def test_gather_matches_torch(dual, tile_m, n, k, ms, swz, kcu, prefetch, once, rows_first, whole):
    torch.manual_seed(0)
    g = len(ms)
    w = [quantize(torch.randn(n, k) * 3, global_scale=torch.tensor(0.5 + i)).to(DEV) for i in range(g)]
    w2 = [quantize(torch.randn(n, k), global_scale=torch.tensor(2.0 + i)).to(DEV) for i in range(g)] if dual else None
    a = [quantize(torch.randn(m, k), global_scale=torch.tensor(1.5 * (i + 1))).to(DEV) for i, m in enumerate(ms)]
    keep = []

    def sc(t):
        s = t.scales.view(torch.uint8)
        if swz:
            s = swizzle_scales(s).contiguous()
        keep.append(s)
        return s.data_ptr()

    table = []
    for i in range(g):
        b2 = w2[i] if dual else w[i]
        row = [a[i].data.data_ptr(), sc(a[i]), ms[i], w[i].data.data_ptr(), sc(w[i]), b2.data.data_ptr(), sc(b2),
               a[i].global_scale.data_ptr(), w[i].global_scale.data_ptr(), b2.global_scale.data_ptr()]
        table += row + [0] * (F - len(row))
    t = torch.tensor(table, dtype=torch.int64, device=DEV)
    n_pad, k_pad = -(-n // tile_m) * tile_m, -(-k // 128) * 128
    blocks = tile_m * (2 if dual else 1) // (64 * NWG)
    packed, codes, scales, offs, gs_a, gs_b = launch(t, g, n, k, n_pad, k_pad, NWG, blocks, dual, sum(ms),
                                                     swz_a=swz, swz_b=swz, post=2.0 ** 14, kcu=kcu,
                                                     prefetch=prefetch, once=once, rows_first=rows_first,
                                                     whole=whole)
    mats = []
    for ws in [w] + ([w2] if dual else []):
        mats.append((torch.cat([_pad(x.data, n_pad, k_pad // 2) for x in ws]),
                     torch.cat([_pad(x.scales.view(torch.uint8), n_pad, k_pad // 16) for x in ws])))
    assert torch.equal(packed, prepack_weights(mats, NWG, blocks))
    assert torch.equal(codes, torch.cat([x.data for x in a]))
    assert torch.equal(scales, torch.cat([x.scales.view(torch.uint8) for x in a]))
    assert offs.tolist() == [0] + torch.tensor(ms).cumsum(0).tolist()
    assert torch.equal(gs_a, torch.stack([x.global_scale for x in a]))
    want = torch.stack([torch.stack([x.global_scale for x in w]), torch.stack([x.global_scale for x in (w2 or w)])], 1)
    assert torch.equal(gs_b, want * 2.0 ** 14)


def test_gather_bench_rows_account_bytes_and_check_identity(monkeypatch):
    """``gather-bench`` rows (timing stubbed: no GPU here): both parts per knob, bytes read + written, and the packed
    weights checked against the torch prepack, an empty group and the dual form included."""
    import nvfp4lib.bench.gather_bench as gb
    import nvfp4lib.serving as sv
    from nvfp4lib.problems import GroupedProblem, get_problem, make_inputs

    monkeypatch.setattr(gb, "make_inputs", lambda p, seed, mode, device: make_inputs(p, seed=seed, mode=mode,
                                                                                     device=DEV))
    monkeypatch.setattr(gb, "_time", lambda fn, iters, flush: [float(i + 1) for i in range(iters)])
    monkeypatch.setattr(gb, "L2Flusher", lambda: None)
    monkeypatch.setitem(sv._GPU_NAMES, torch.device(DEV), "cpu")
    probs = [get_problem("E1-empty-group"), GroupedProblem.uniform_nk("d", (3, 0, 5), 256, 512).with_dual()]
    rows = gb.bench_gather(probs, kcus=[1, 8], iters=3, ceilings={"copy_gbps": 3000.0, "bf16_tflops": 700.0})
    assert len(rows) == 2 * 2 * 2 and all(r["status"] == "ok" and r["identical"] for r in rows)
    dual = [r for r in rows if r["dual"] and r["part"] == "weights"][0]
    assert dual["bytes"] == 2 * 2 * 3 * (256 * 512 // 2 + 256 * 512 // 16)  # two matrices a group: read, written
    assert dual["median_us"] == 2.0 and dual["floor_us"] == dual["bytes"] / 3000e3
