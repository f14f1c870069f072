"""Which (activation K tile, weight K tile) products does the fused-decode kernel sum? (Ran at commit 3eccde4, where
the `*_f` configs exist; removed since.) Least squares of its output on
every A_i·B_jᵀ: the right kernel gives the identity. python wip/rs/debug_fused.py"""
import torch

from nvfp4lib.api import prepare
from nvfp4lib.formats import dequantize
from nvfp4lib.problems import GroupedProblem, make_inputs

for M, N, K in ((128, 256, 256), (96, 384, 384)):
    prob = GroupedProblem.uniform_nk(f"dbg{M}x{N}x{K}", [M], N, K)
    inp = make_inputs(prob, seed=1, device="cuda")
    A = dequantize(inp.a[0]).double().cpu()
    B = dequantize(inp.b[0]).double().cpu()
    T = K // 128
    basis = {(i, j): (A[:, i * 128:(i + 1) * 128] @ B[:, j * 128:(j + 1) * 128].T).flatten()
             for i in range(T) for j in range(T)}
    X = torch.stack(list(basis.values()), 1)
    for cfg in ("rs_m128_t128_k128_s4_e", "rs_m128_t128_k128_s4_e_f"):
        r = prepare(inp.a, inp.b, None, backend="cute-hopper", config=cfg)
        r.outputs[0].fill_(float("nan"))
        r()
        torch.cuda.synchronize()
        out = r.outputs[0].double().cpu()
        y = out.flatten()
        fin = torch.isfinite(y)
        coef = torch.linalg.lstsq(X[fin], y[fin].unsqueeze(1)).solution.squeeze(1)
        res = (X[fin] @ coef - y[fin]).norm() / y[fin].norm()
        full = (A @ B.T)
        err = ((out - full).norm() / full.norm()).item()
        cols = ((out - full).abs().amax(1) > 1e-2 * full.abs().max()).nonzero().flatten().tolist()
        rows = ((out - full).abs().amax(0) > 1e-2 * full.abs().max()).nonzero().flatten().tolist()
        print(f"{prob.name} {cfg:<26} rel_err {err:.3g} nonfinite {int((~fin).sum())} fit residual {res:.3g}")
        print("   coef", {k: round(float(c), 3) for k, c in zip(basis, coef)})
        print(f"   bad tokens {len(cols)}: {cols[:12]}  bad weight rows {len(rows)}: {rows[:12]}")
