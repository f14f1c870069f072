"""One serving-GEMM config's calls for a sanitizer: an eager call, then graph replays with new routings, each checked.

Run it under compute-sanitizer with the kernels filtered to the serving GEMM (the input set-up's torch kernels are then
not instrumented, which keeps a run to about a minute)::

    compute-sanitizer --report-api-errors no --kernel-name kns=GroupedVarlenGemmSm90 --tool racecheck \\
        python tools/racecheck_probe.py vl_m128_t16_k128_s8_e_x --build handoff_wait=0

``--build FIELD=VALUE`` sets the serving kernel's build knobs by their recipe fields
(:func:`nvfp4lib.kernels.hopper_varlen.runner.build_setting`, the A/B arms of ``hopper_varlen.kernel``'s racecheck
note). The shape: 4 rows over 64 groups, N 1024, K 4096 (split-K configs split each tile's K). An NVFP4-activation
config's eager call runs the fused kernel, its captured calls the prologue and the GEMM. Needs a Hopper GPU.
"""
from __future__ import annotations

import argparse
import sys

import torch

from nvfp4lib.formats import dequantize
from nvfp4lib.kernels.hopper_varlen.config import CONFIGS
from nvfp4lib.kernels.hopper_varlen.runner import BUILD_KNOBS, build_setting
from nvfp4lib.problems import GroupedProblem, make_inputs
from nvfp4lib.reference import relative_error
from nvfp4lib.serving import prepare_weights

GROUPS, N, K, ROWS = 64, 1024, 4096, 4
TOL = 1e-3


def _knob(text: str) -> tuple[str, object]:
    """FIELD=VALUE, the value of the knob's own type (its value now: a flag as 0/1, a count, a name)."""
    field, _, value = text.partition("=")
    known = {f: getattr(mod, name) for f, mod, name in BUILD_KNOBS}
    if field not in known or not value:
        raise argparse.ArgumentTypeError(f"{text!r}: FIELD=VALUE with FIELD one of {', '.join(known)}")
    kind = type(known[field])
    return field, bool(int(value)) if kind is bool else kind(value)


def _offsets(gen: torch.Generator, one_group: bool) -> torch.Tensor:
    if one_group:
        cut = int(torch.randint(0, GROUPS, (1,), generator=gen))
        cuts = (torch.arange(GROUPS - 1) >= cut).to(torch.int64) * ROWS
    else:
        cuts = torch.sort(torch.randint(0, ROWS + 1, (GROUPS - 1,), generator=gen)).values
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([ROWS])]).to(torch.int32).cuda()


def probe(config: str, replays: int) -> float:
    """The largest relative error of the eager call and the replays against the reference."""
    cfg = CONFIGS[config]
    prob = GroupedProblem.uniform_nk("probe", (ROWS,) + (0,) * (GROUPS - 1), N, K)
    inp = make_inputs(prob.with_dual() if cfg.dual else prob, seed=11, mode="gaussian", device="cuda")
    w = prepare_weights(inp.b, inp.b2, config=config, activations=cfg.act)
    ref = prepare_weights(inp.b, inp.b2, backend="reference", activations=cfg.act)
    x = inp.a[0] if cfg.act == "nvfp4" else dequantize(inp.a[0]).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    offsets = _offsets(gen, one_group=False)
    errs = [relative_error([w(x, offsets)], [ref(x, offsets)])]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = w(x, offsets)
    for it in range(replays):
        offsets.copy_(_offsets(gen, one_group=it % 2 == 1))
        c.fill_(float("nan"))
        graph.replay()
        errs.append(relative_error([c], [ref(x, offsets)]))
    torch.cuda.synchronize()
    print(f"{config}: K slices {w.impl.runner(config).slices(ROWS)}, {1 + replays} calls, max rel err {max(errs):.2e}")
    return max(errs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("config", choices=sorted(CONFIGS), metavar="CONFIG", help="a hopper_varlen config name")
    p.add_argument("--build", type=_knob, action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--replays", type=int, default=3)
    args = p.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        p.error("needs a Hopper GPU (sm_90): the serving GEMM runs nowhere else")
    with build_setting(**dict(args.build)):
        return 0 if probe(args.config, args.replays) <= TOL else 1


if __name__ == "__main__":
    sys.exit(main())
