"""The decode-step profile's CPU parts (nvfp4lib.bench.kernel_profile): kernel names to categories (every Triton kernel
nvfp4lib launches among them, read from the sources), a profile summed per category, and the split by module (the
record_function ranges the hooks open, found again from a profiler's events, here on the CPU's ops). The profile of a
CUDA graph's replays needs a GPU (generate-bench --profile-step)."""
import ast
from pathlib import Path

import pytest
import torch

from nvfp4lib.bench import kernel_profile as kp

ROOT = Path(__file__).resolve().parents[1]

NAMES = {  # full kernel names as CUPTI reports them (CuTe DSL mangles the kernel's class into its name)
    "kernel_cutlass_kernel_nvfp4libkernelshopper_varlenkernelkernel_classeslocalsGroupedVarlenGemmSm90_object_at__"
    "tensorptr_0": "serving kernel",
    "kernel_cutlass_kernel_nvfp4libkernelshopper_varlenkernelkernel_classeslocalsActivationDecodeSm90_object_at_":
        "serving kernel",
    "_quant_kernel": "nvfp4lib Triton",
    "gather": "nvfp4lib Triton",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)": "attention",
    "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>(Flash_fwd_params)":
        "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0": "attention",
    "void cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x<cutlass::gemm::kernel::GemmUniversal<"
    "cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int>>>>>(...)": "torch grouped GEMM",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_"
    "cublas": "torch GEMM",
    "nvjet_tst_64x8_64x16_4x1_v_bz_TNT": "torch GEMM",
    "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false, false>(...)":
        "torch GEMM",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1>>(...)":
        "torch elementwise",
    "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)":
        "torch elementwise",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>(...)":
        "torch reduction",
    "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)": "torch reduction",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(...)": "torch reduction",
    "Memcpy DtoD (Device -> Device)": "memcpy/memset",
    "Memset (Device)": "memcpy/memset",
    "a_kernel_nobody_named": "other",
}


@pytest.mark.parametrize("name, category", NAMES.items())
def test_kernel_names_fall_in_their_category(name, category):
    assert kp.categorize(name) == category


def _triton_entry_points(path: Path) -> set[str]:
    """The @triton.jit functions of a source file that no other one calls: the kernels it launches (the rest are
    device helpers, inlined into them)."""
    tree = ast.parse(path.read_text())
    jit = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)
           and any("jit" in ast.unparse(d) for d in f.decorator_list)}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return jit - called


def test_every_triton_kernel_nvfp4lib_launches_is_its_own_category():
    nn = sorted((ROOT / "nvfp4lib/nn").glob("*_triton.py"))
    files = [*nn, *(ROOT / "nvfp4lib/kernels/hopper_varlen").glob("*_triton.py")]
    names = set().union(*(_triton_entry_points(f) for f in files))
    assert {"_amax_kernel", "_quant_kernel", "_route_kernel", "_unpermute_kernel", "gather"} <= names
    assert {n: kp.categorize(n) for n in names} == {n: "nvfp4lib Triton" for n in names}
    assert kp.categorize("_amax_kernel_v2") != "nvfp4lib Triton"  # whole names only: torch's gather is not ours


def test_by_category_sums_in_the_tables_order():
    got = kp.by_category([("nvjet_tst_1", 3.0), ("_quant_kernel", 1.0), ("nvjet_tst_2", 2.0), ("Memset (Device)", 0.5)])
    assert list(got) == ["nvfp4lib Triton", "torch GEMM", "memcpy/memset"]
    assert got["torch GEMM"] == {"us": 5.0, "kernels": 2}


def test_step_summary_adds_the_kernels_and_the_gaps():
    prof = {"span_us": 10.0, "kernels_per_call": 3, "iters": 5, "kernels": [
        {"name": "a", "category": "torch GEMM", "median_us": 4.0, "start_us": 0.0},
        {"name": "b", "category": "attention", "median_us": 2.0, "start_us": 5.0},
        {"name": "c", "category": "torch GEMM", "median_us": 1.0, "start_us": 9.0}]}
    s = kp.step_summary(prof)
    assert s["categories"] == {"attention": {"us": 2.0, "kernels": 1}, "torch GEMM": {"us": 5.0, "kernels": 2}}
    assert (s["sum_us"], s["span_us"], s["gap_us"], s["kernels"]) == (7.0, 10.0, 3.0, 3)
    with pytest.raises(RuntimeError, match="not a whole number"):
        kp.step_summary({"error": "7 kernel records for 2 calls: not a whole number per call"})


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.act(self.proj(x)) * 2  # the multiply: the block's own op


def test_module_ranges_name_the_innermost_module_of_each_op():
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(_Block(), torch.nn.Tanh())
    x = torch.randn(2, 8)
    with kp._ModuleRanges(model) as ranges, profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x).sum()
    assert not ranges.open
    owners = {}
    for e in prof.events():
        if e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")):
            owners.setdefault(e.name, kp.owner(e))
    assert owners["aten::linear"] == "Linear" and owners["aten::relu"] == "ReLU"
    assert owners["aten::mul"] == "_Block" and owners["aten::tanh"] == "Tanh"
    assert owners["aten::sum"] == "(no module)"
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # the hooks are removed


def test_module_profile_counts_kernels_no_torch_op_launched(monkeypatch):
    """module_profile follows each kernel torch links to a CPU op up to its module, and counts the kernels no torch op
    launched (TVM-FFI's and Triton's launches) under UNLINKED, so that the modules add up to every kernel: made-up
    profiler events (the shapes torch gives), on the CPU."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Kernel

    rng = NS(name=kp._RANGE + "NVFP4Linear", cpu_parent=None, device_type=DeviceType.CPU, kernels=[])
    op = NS(name="aten::mm", cpu_parent=rng, device_type=DeviceType.CPU, kernels=[Kernel("nvjet_tst_64x8", 0, 4.0)])

    def dev(name, us):
        return NS(name=name, device_type=DeviceType.CUDA, is_user_annotation=False,
                  time_range=NS(start=10.0, end=10.0 + us), kernels=[])

    events = [rng, op, dev("nvjet_tst_64x8", 4.0), dev("kernel_cutlass_kernel_x_GroupedVarlenGemmSm90_0", 12.0),
              dev("_quant_kernel", 2.0)]

    class FakeProfile:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return events

    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    got = kp.module_profile(lambda: None, torch.nn.Linear(2, 2), iters=2)["modules"]
    assert got["NVFP4Linear"] == {"torch GEMM": {"us": 2.0, "kernels": 0.5}}
    assert got[kp.UNLINKED] == {"serving kernel": {"us": 6.0, "kernels": 0.5}, "nvfp4lib Triton": {"us": 1.0,
                                                                                                  "kernels": 0.5}}
