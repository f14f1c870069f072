"""Run one prepared cute-hopper runner a few times (for ncu): python wip/rs/ncu_one.py S4 rs_m128_t128_k128_s4"""
import sys

import torch

from nvfp4lib.api import prepare
from nvfp4lib.problems import get_problem, make_inputs

inp = make_inputs(get_problem(sys.argv[1]), seed=1, device="cuda")
r = prepare(inp.a, inp.b, inp.b2, backend="cute-hopper", config=sys.argv[2])
for _ in range(3):
    r()
torch.cuda.synchronize()
