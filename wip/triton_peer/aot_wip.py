"""AOT-compile the wip Triton swap kernel (and activation decode) for sm_90a on this CPU machine; SASS stats."""
import importlib.util, sys, re
sys.path.insert(0, "/work/main/scratch_p"); sys.path.insert(0, "/work/main")
from aot import compile_sm90, stats
spec = importlib.util.spec_from_file_location("nvfp4lib.peers.triton_wip", "/work/main/scratch_p/wip_triton_nvfp4.py")
T = importlib.util.module_from_spec(spec); spec.loader.exec_module(T)
K = T._build_kernels()
def loop_stats(sass):
    lines = sass.splitlines()
    brs = [(i, re.search(r"BRA `\((\.L_x_\d+)\)", l).group(1)) for i, l in enumerate(lines)
           if re.search(r"@!?P\d BRA `\(\.L_x_\d+\)", l)]
    best = None
    for i, lab in brs:  # backward branches = loops; take the one containing HGMMA
        j = next((k for k, l in enumerate(lines) if l.startswith(lab + ":")), None)
        if j is not None and j < i and any("HGMMA" in l for l in lines[j:i]):
            n = sum(1 for l in lines[j:i] if re.search(r"\*/\s+\S", l))
            if best is None or n < best[0]:
                best = (n, sum("HGMMA" in l for l in lines[j:i]))
    return best
for dual in (0, 1):
    for bn, bt, bk, w, s in (T.SWAP_DUAL_CANDIDATES if dual else T.SWAP_CANDIDATES):
        wd, xd = f"tensordesc<u8[{bn}, {bk//2}]>", f"tensordesc<fp16[{bt}, {bk//2}]>"
        names = ["w_desc", "sfw_ptr", "w2_desc", "sfw2_ptr", "x_desc", "c_ptr", "tiles_ptr", "alpha_ptr", "stride_sfw", "stride_c"]
        types = [wd, "*u8", wd, "*u8", xd, "*fp16", "*i32", "*fp32", "i32", "i32"]
        sig = dict(zip(names, types), DUAL="constexpr", BLOCK_N="constexpr", BLOCK_T="constexpr", BLOCK_K="constexpr", PTX="constexpr")
        k = compile_sm90(K.swap, sig, {"DUAL": bool(dual), "BLOCK_N": bn, "BLOCK_T": bt, "BLOCK_K": bk, "PTX": True}, w, s)
        sass = stats(k, f"swap dual={dual} {bn},{bt},{bk} w{w} s{s}")
        ls = loop_stats(sass)
        if ls:
            n, h = ls
            elems = bn * bk // (w * 32)  # weight elements decoded per thread per K step
            print(f"   main loop: {n} instrs/thread/K-step, {h} HGMMA, {elems} weight elems/thread -> {n/elems:.1f} instr/elem"
                  f", STL {sass.count('STL')}")
names = ["codes_ptr", "sf_ptr", "out_ptr", "rows", "stride_c", "stride_s", "stride_o"]
sig = dict(zip(names, ["*u8", "*u8", "*fp16", "i32", "i32", "i32", "i32"]), BLOCK_R="constexpr", BLOCK_K="constexpr", PTX="constexpr")
stats(compile_sm90(K.decode_activations, sig, {"BLOCK_R": 32, "BLOCK_K": 128, "PTX": True}, 4, 1), "decode_activations")
