"""The decode benchmark of issue 40: an NVFP4 checkpoint loaded by :func:`nvfp4lib.hf.from_pretrained` against the
same model in bf16, greedy decoding under CUDA graphs, per batch.

Per checkpoint format (:data:`~nvfp4lib.hf.checkpoint.FORMATS`), :func:`bench_generate` writes one random checkpoint
(:func:`~nvfp4lib.hf.make_checkpoint`, drawn on the device, into a temporary folder that is deleted after its
models) and measures one model at a time, each freed before the next is built (the bf16 model of the Qwen3-30B-A3B
shape holds ~61 GB, the NVFP4 one ~17 GB):

- ``"nvfp4"``: the checkpoint as :func:`~nvfp4lib.hf.from_pretrained` loads it, once per activations mode
  (``"nvfp4"``: W4A4 with the checkpoint's static activation scales; ``"bf16"``: W4A16);
- ``"bf16-peer"``: the same architecture with every weight dequantized to bf16 (:func:`load_bf16`): attention and
  the dense Linears as plain bf16 ``Linear``, the experts as the project's bf16 grouped-GEMM peer layer
  (:class:`~nvfp4lib.bench.peers.bf16_moe.BF16GroupedMoE`); routing, norms, embeddings as in transformers;
- ``"transformers-bf16"``: transformers' own model with the same dequantized weights, as users run it (its own
  experts code, ``config._experts_implementation``, and attention, both recorded).

The parts run in priority order (:func:`_plan`), so that a run cut short keeps what matters most: on the first
format's checkpoint the bf16 peer (the reference every later row is checked against, and the targets' denominator),
then the NVFP4 model per activations mode (W4A4, W4A16): every row issue 40's targets need; then the other formats'
NVFP4 models; transformers' model last of all, on the last format's checkpoint (the lowest priority, and its capture
attempt is the riskiest step). The bf16 models are built once (their weights are the dequantized values, the same in
either format up to compressed-tensors' one rounding of a reciprocal); one checkpoint is on disk at a time.

Each model decodes every batch with :func:`nvfp4lib.hf.generate` (a static KV cache; ``cuda_graph=True`` on a GPU),
timed over the steady-state steps only (after the warm-up and capture steps: compiles and the capture are not
timed). Batch b decodes b distinct seeded random prompts of :data:`PROMPT_TOKENS` tokens (a repeated prompt would
route every row to the same experts). transformers' model is also decoded eagerly and by its own
``model.generate()`` (a dynamic cache: the loop users call; timed as the difference of two runs, so that the prefill
and the first steps cancel), and graphed only if its step can be captured (a row says what happened either way).

Model kinds, labels and loops are named by :data:`KINDS`, :data:`LABELS`, ``loop`` (:data:`STATIC`,
:data:`HF_GENERATE`) and ``cuda_graph``; the report (:mod:`nvfp4lib.study.generate_report`) reads them.

Correctness, cheaply: every model's logits over the first prompt (one forward, no cache) are compared with the bf16
peer's (``logits_rel_err``, normwise, fp32) as its rows are made: the W4A16 model and transformers' model must agree
within bf16 noise (:data:`TOL`); W4A4's error is its own quantization's and is bounded loosely (a wrong scale or
expert is O(1)).

A row per planned (model, loop, batch), each final when made and handed to ``sink`` at once (``generate-bench
--out`` appends it to the file then, so a run that is killed keeps every row measured): tokens/s, ms per token, batch,
activations, format, model kind, the GPU memory the loaded model holds (``loaded_gib``: allocated after loading minus
before) and its peak while loading (``load_peak_gib``), the decode's peak, the check, the times spent (checkpoint
writing, loading, the decode call with its compiles and capture: ``wall_s``; ``run_elapsed_s``) and
:func:`~nvfp4lib.bench.store.provenance` with a ``run_id``; every row carries ``planned_rows``, so a reader tells a
run that ended early. A model kind that fails (load, check or decode) gives rows with its error as ``status``; the
others are kept. With ``budget_s``, no part (a checkpoint, a model) starts after that many seconds: the rows not
measured say "skipped: ...";
a stop (SIGTERM, Ctrl-C) gives them "not reached: ...". Rows are returned, never stored here (``python -m nvfp4lib
generate-bench --record`` appends them to ``data/generate.jsonl``; ``record`` merges an ``--out`` file there).

Where a step's time goes (``profile_steps``, ``generate-bench --profile-step N``; GPU only): after each graphed decode
of :func:`nvfp4lib.hf.generate` (its timing done), the captured decode step is replayed N times under the profiler
(:func:`~nvfp4lib.bench.kernel_profile.profile_runner`, CUPTI's kernel records, back to back as decoding replays it),
and :data:`MODULE_STEPS` eager steps run with a ``record_function`` range around every module's forward
(:func:`~nvfp4lib.bench.kernel_profile.module_profile`: a graph's replay keeps no CPU-side ranges, so the split by
module is the eager steps'; with ``eager_fused`` off, the default, the NVFP4 models' eager calls run the captured
form's kernels). Their rows, made with the decode row's fields, carry ``profile``: ``"graph"`` (one per kernel
category, :data:`~nvfp4lib.bench.kernel_profile.CATEGORIES`: ``us_per_step``, ``kernels_per_step``, and the step's
``step_kernels``, ``step_sum_us``, ``step_span_us``, ``step_gap_us``) or ``"eager-modules"`` (one per innermost module
class and category). Every row of such a run carries ``profile_steps`` (None otherwise), and notebook 12's answer
ignores those runs (they are short: :data:`PROFILE_COMMAND`); a failed profile gives one row with its error as
status (where only the split by module failed, that row's ``profile`` is ``"eager-modules"`` and the graph's rows
stay). A step through ``torch.compile`` is profiled the same way: its split by module is the compiled step's (where
Inductor's code holds no module forwards, its kernels count under the modules still called).

Runtime of the ``qwen3-30b-a3b`` preset on a fresh H100 machine, estimated step by step (not measured yet; each row's
times will say): the start (imports, CUDA context) ~15 s; writing a checkpoint, 18,432 expert matrices drawn,
quantized and copied one at a time plus ~17 GB of safetensors, 40-90 s; the bf16 peer, 61 GB dequantized expert by
expert, 40-60 s to load, ~10 s to decode both batches (``torch._grouped_mm``: nothing to compile); each NVFP4 model
20-40 s to load and ~10 s to decode, plus its kernels' compiles on first use: per activations mode the Linears' three
weight shapes (q, k/v, o) at batch 1 (16-token tiles) and batch 32 (256-token tiles with 32-token steps:
``tuning.PREFERENCE``) and the experts' two (16-token tiles at both batches: at most 4 rows per expert) = 8 configs,
the three 32-step ones ~30 s each (``prepare_s`` of ``vl_*_v32_e`` rows in ``data/bench.jsonl``: 25-40 s on the H100
host; the W4A16 one took 45 s against W4A4's 26 s on a 2-core development CPU), the rest 2-5 s: W4A4 ~110 s, W4A16
~150 s. The targets (the first format's three models) thus take ~7.5-8.5 minutes; the second format adds 2-3
(compiles done), transformers' model 1.5-3 (its eager steps, its generate() and a capture attempt). The default run
is longer than a 10-minute machine command: run it under ``timeout`` with ``budget_s`` (notebook 12 gives the
command).
"""
from __future__ import annotations

import gc
import re
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from .moe_bench import knob_setting
from .store import new_run_id, provenance

__all__ = ["KINDS", "ACTIVATIONS", "STATIC", "COMPILED", "HF_GENERATE", "MODULE_STEPS", "PROFILE_COMMAND",
           "BATCHES", "NEW_TOKENS", "PROMPT_TOKENS", "PRESETS", "TOL", "LABELS", "load_bf16", "bench_generate",
           "add_command"]

KINDS = ("nvfp4", "bf16-peer", "transformers-bf16")
ACTIVATIONS = ("nvfp4", "bf16")  # the NVFP4 model's: W4A4, W4A16
BATCHES = (1, 32)
NEW_TOKENS = 64
# Two prompt tokens: the prefill's rows then fall in the decode steps' rows-per-group buckets at batch 1 and 32 (Linears
# 2 and 64 rows, experts <= 4 rows per group), so the serving kernel compiles no config beyond the decode steps' (each
# compile is seconds; a 16-token prompt adds four Linear and two expert configs per activations mode). The decode
# timing does not depend on it: the KV cache holds a few tens of positions either way.
PROMPT_TOKENS = 2
PRESETS = ("qwen3-30b-a3b", "tiny")  # nvfp4lib.hf.writer.PRESETS' names; tiny runs on the CPU (reference backend)
LABELS = {("nvfp4", "nvfp4"): "NVFP4 W4A4", ("nvfp4", "bf16"): "NVFP4 W4A16", ("bf16-peer", "bf16"): "bf16 peer",
          ("transformers-bf16", "bf16"): "transformers bf16"}
# The loops a row can time: nvfp4lib.hf.generate (a static cache; graphed or eager), the same with its decode step
# through torch.compile (generate-bench --compile; the NVFP4 models and the bf16 peer) and transformers'
# model.generate() (a dynamic cache, eager)
COMPILE_FORMS = ("opaque", "traced")  # how torch.compile sees the NVFP4 modules (nvfp4lib.nn.compiled.OPAQUE)
STATIC, COMPILED, HF_GENERATE = "nvfp4lib.hf.generate", "nvfp4lib.hf.generate + torch.compile", "transformers.generate"
# Normwise relative error of a model's logits against the bf16 peer's, over the first prompt:
# - W4A16 and transformers' model run the peer's dequantized weights: only bf16 roundings differ (each Linear's
#   output, the experts' intermediate, sums in another order), and they add up over the layers: 3.6e-3 (W4A16 5e-3)
#   on the two-layer tiny preset, 1.6e-2 (W4A16 1.9e-2) on a random 48-layer model of hidden 256 and a 16-token
#   prompt (CPU, reference backend, seed 0). 5e-2 leaves a margin over that and still fails a wrong expert, scale or
#   layer (O(1)).
# - W4A4 quantizes activations too: 0.15 (tiny), 0.22 (the 48-layer model) against the peer; its bound only catches
#   what is broken.
TOL = {"nvfp4": 0.6, "bf16": 5e-2, "transformers-bf16": 5e-2}
MODULE_STEPS = 2  # eager steps of --profile-step's split by module (each step's kernels are the same)
# The profile run: the targets' models (one format), both batches, few decode steps (the profile replays its own);
# ~4-5 minutes on an H100 (the module doc's estimate, less the second format and transformers' model)
PROFILE_COMMAND = ("timeout -k 30 560 python -m nvfp4lib generate-bench --format modelopt --kinds nvfp4 bf16-peer "
                   "--new-tokens 12 --profile-step 20 --budget-s 420 --out generate.jsonl --no-record")
HF_GENERATE_SHORT = 4  # transformers' generate() timed as t(new_tokens) - t(this many): prefill and first steps cancel
# rounds of (short, long) runs at most: two, then more only while the long run's best is not above the short run's
# (a loaded CPU made a tiny model's 8-token run time below its 4-token run in CI)
HF_GENERATE_ROUNDS = 6
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def load_bf16(path, *, experts: str = "peer", device="cuda") -> torch.nn.Module:
    """The checkpoint at ``path`` as a bf16 transformers causal LM (eval mode), every NVFP4 weight dequantized once
    (:func:`nvfp4lib.formats.dequantize`, one rounding to bf16), one layer at a time on ``device``.

    ``experts="peer"``: each experts module becomes :class:`nvfp4lib.hf.modules.NVFP4Experts` on
    :class:`~nvfp4lib.bench.peers.bf16_moe.BF16GroupedMoE`; ``experts="transformers"``: transformers' own experts
    module, its ``gate_up_proj [E, 2I, H]`` (gate rows first) and ``down_proj [E, H, I]`` filled with the same bf16
    values. The peak while loading is the model plus one layer's NVFP4 experts."""
    from ..formats import dequantize
    from ..hf.archs import EXPERT_RE, arch_of
    from ..hf.checkpoint import KV_CACHE_LEAVES, Checkpoint, CheckpointError, read_config, read_nvfp4, read_scheme
    from ..hf.loader import build_skeleton
    from ..hf.modules import NVFP4Experts
    from ..hf.modules import set_module_tensor as _set
    from .peers.bf16_moe import BF16GroupedMoE

    if experts not in ("peer", "transformers"):
        raise ValueError(f"experts must be 'peer' or 'transformers', got {experts!r}")
    path, device = Path(path), torch.device(device)
    config, scheme, ck = read_config(path), read_scheme(path), Checkpoint(path)
    arch = arch_of(config, str(path / "config.json"))
    model = build_skeleton(config)
    n_layers = model.config.get_text_config().num_hidden_layers
    f = scheme.fields
    quantized = {n.rpartition(".")[0] for n in ck.names if n.rpartition(".")[2] == f["scales"]}
    expert_parts: dict = defaultdict(dict)  # model experts module -> {(e, role): checkpoint module}
    linears, plain = [], {}  # checkpoint modules; model tensor name -> checkpoint tensor name
    for name in ck.names:
        m = _LAYER_RE.match(name)
        mod, _, leaf = name.rpartition(".")
        if (m and int(m.group(1)) >= n_layers) or leaf in KV_CACHE_LEAVES:
            continue  # as from_pretrained: layers past num_hidden_layers and KV-cache scales are not read
        if mod in quantized and leaf != "bias":
            em = EXPERT_RE.match(arch.to_model(mod))
            if em:
                expert_parts[em["experts"]][(int(em["e"]), arch.roles[em["proj"]])] = mod
            elif leaf == f["scales"]:
                linears.append(mod)
        else:
            plain[arch.to_model(name)] = name

    for name, parts in expert_parts.items():
        module = model.get_submodule(name)
        n_exp = module.gate_up_proj.shape[0]
        inter, hidden = module.gate_up_proj.shape[1] // 2, module.gate_up_proj.shape[2]
        shapes = {"gate": (inter, hidden), "up": (inter, hidden), "down": (hidden, inter)}
        missing = [(e, r) for e in range(n_exp) for r in shapes if (e, r) not in parts]
        if missing:
            e, r = missing[0]
            raise CheckpointError(f"{path}: missing tensor {arch.to_checkpoint(name)}.{e}.{arch.proj(r)}."
                                  f"{f['codes']}")
        if experts == "peer":
            ws = {r: [read_nvfp4(ck, scheme, parts[(e, r)], device, shapes[r])[0] for e in range(n_exp)]
                  for r in shapes}
            _set(model, name, NVFP4Experts(BF16GroupedMoE(ws["gate"], ws["up"], ws["down"])))
            del ws
        else:  # the same values as BF16GroupedMoE's w13 and w2, in transformers' parameters
            gate_up = torch.empty((n_exp, 2 * inter, hidden), dtype=torch.bfloat16, device=device)
            down = torch.empty((n_exp, hidden, inter), dtype=torch.bfloat16, device=device)
            for e in range(n_exp):
                for r, dst in (("gate", gate_up[e, :inter]), ("up", gate_up[e, inter:]), ("down", down[e])):
                    dst.copy_(dequantize(read_nvfp4(ck, scheme, parts[(e, r)], device, shapes[r])[0], torch.bfloat16))
            _set(model, f"{name}.gate_up_proj", gate_up)
            _set(model, f"{name}.down_proj", down)
    for mod in linears:
        target = arch.to_model(mod)
        lin = model.get_submodule(target)
        w, _ = read_nvfp4(ck, scheme, mod, device, (lin.out_features, lin.in_features))
        _set(model, f"{target}.weight", dequantize(w, torch.bfloat16))
    targets = dict(model.named_parameters())
    targets.update(dict(model.named_buffers()))
    for tname, cname in plain.items():
        ref = targets.get(tname)
        if ref is None:
            raise CheckpointError(f"{path / ck.file_of(cname)}: tensor {cname!r} has no place in the "
                                  f"{type(model).__name__} (no parameter or buffer {tname!r})")
        if ref.device.type == "meta":
            _set(model, tname, ck.get(cname).to(device, ref.dtype))
    ck.close()
    cfg = model.config.get_text_config()
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if getattr(cfg, "tie_word_embeddings", False) and out is not None and out.weight.device.type == "meta":
        out.weight = inp.weight
    for name, m in list(model.named_modules()):  # computed buffers (rotary embeddings), rebuilt from the config
        if type(m).__name__.endswith("RotaryEmbedding") and any(
                b is not None and b.device.type == "meta" for b in m._buffers.values()):
            _set(model, name, type(m)(m.config).to(device))
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.device.type == "meta"]
    if left:
        raise CheckpointError(f"{path}: missing tensor(s) for {', '.join(left[:5])}"
                              + (f" and {len(left) - 5} more" if len(left) > 5 else ""))
    return model.eval().requires_grad_(False)


# --------------------------------------------------------------------------------------------------- measuring


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        try:
            torch.cuda.empty_cache()
        except RuntimeError:  # a stop inside a CUDA graph's capture leaves it open: the cache is kept, not an error
            pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double(), ref.double()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    den = float(ref.norm())
    return float((a - ref).norm()) / den if den else float("inf")


def _error(e: BaseException) -> str:
    return f"error: {type(e).__name__}: {str(e).strip()[:400]}"


def _hf_generate(model, ids: torch.Tensor, new_tokens: int, device: torch.device) -> dict:
    """transformers' own ``model.generate()`` (greedy, its default dynamic cache), timed over ``new_tokens -
    HF_GENERATE_SHORT`` steps as the difference of a long and a short run (after one short warm-up run)."""
    short = min(HF_GENERATE_SHORT, new_tokens - 1)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def run(n):
        _sync(device)
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        _sync(device)
        return time.perf_counter() - t, out

    run(short)  # warm-up
    t_short, t_long = float("inf"), float("inf")
    for attempt in range(HF_GENERATE_ROUNDS):  # the fastest run of each length: a hiccup does not count
        t_short = min(t_short, run(short)[0])
        t, out = run(new_tokens)
        t_long = min(t_long, t)
        if attempt >= 1 and t_long > t_short:  # at least two rounds; more only while the difference is noise
            break
    steps = new_tokens - short
    dt = t_long - t_short
    if out.shape[1] != ids.shape[1] + new_tokens:
        raise RuntimeError(f"transformers' generate() returned {out.shape[1] - ids.shape[1]} new tokens, not "
                           f"{new_tokens}")
    if not dt > 0:
        raise RuntimeError(f"transformers' generate(): {new_tokens} tokens took {t_long:.4f} s, {short} took "
                           f"{t_short:.4f} s: the difference is noise (decode more tokens)")
    return {"prefill_ms": None, "decode_s": t_long, "timed_steps": steps, "steady_s": dt,
            "tokens_per_s": ids.shape[0] * steps / dt, "ms_per_token": dt / steps * 1e3,
            "tokens": out[:, ids.shape[1]:].cpu()}


class _Interrupted(BaseException):
    """The run was stopped (SIGTERM): the rows measured so far are returned. A BaseException, as KeyboardInterrupt
    is, so that no ``except Exception`` on the way swallows it."""


def _unless_stopped(e: Exception) -> None:
    """Raise :class:`_Interrupted` if ``e`` comes from a stop: a stop raised inside a CUDA graph's capture is replaced
    by the capture's own error, which an ``except Exception`` would take for the model's failure."""
    cause = e
    while cause is not None:
        if isinstance(cause, (_Interrupted, KeyboardInterrupt)):
            raise _Interrupted(str(cause) or type(cause).__name__) from e
        cause = cause.__context__


class _OutOfTime(BaseException):
    """The time budget is spent: nothing new starts (a BaseException for the same reason as :class:`_Interrupted`)."""


def _loops(kind: str, graph: bool, compiled: bool = False) -> list[tuple[str, bool]]:
    """The (loop, cuda_graph) a model kind is decoded with, in order: transformers' model eagerly and by its own
    generate() first, the capture attempt last; the others plainly, then (``compiled``) through torch.compile."""
    if kind == "transformers-bf16":
        return [(STATIC, False), (HF_GENERATE, False)] + ([(STATIC, True)] if graph else [])
    return [(STATIC, graph)] + ([(COMPILED, graph)] if compiled else [])


def _plan(formats, activations, kinds) -> list[tuple[str, list[tuple[str, str]]]]:
    """Per format, the (model kind, activations) measured on its checkpoint, in priority order (the module doc)."""
    plan = []
    for i, fmt in enumerate(formats):
        want = [("bf16-peer", "bf16")] if i == 0 and "bf16-peer" in kinds else []
        want += [("nvfp4", a) for a in activations if "nvfp4" in kinds]
        if i == len(formats) - 1 and "transformers-bf16" in kinds:
            want.append(("transformers-bf16", "bf16"))
        if want:
            plan.append((fmt, want))
    return plan


class _Run:
    """One run's state: its planned rows, the rows so far (each handed to ``sink`` as it is made), the first prompt's
    logits per model, the prompts, the clock and the budget."""

    def __init__(self, base: dict, device: torch.device, batches, prompts: torch.Tensor, new_tokens: int, say,
                 plan, budget_s: float | None, sink, t0: float, profile_steps: int | None = None,
                 compiled: bool = False):
        self.device, self.batches, self.prompts, self.new_tokens = device, tuple(batches), prompts, new_tokens
        self.say, self.sink, self.budget_s, self.t0 = say, sink, budget_s, t0  # t0: the run's start (perf_counter)
        self.graph = device.type == "cuda"
        self.profile_steps, self.compiled = profile_steps, compiled
        self.planned = [(fmt, kind, act, loop, cg, b) for fmt, want in plan for kind, act in want
                        for loop, cg in _loops(kind, self.graph, compiled) for b in self.batches]
        self.base = {**base, "planned_rows": len(self.planned), "budget_s": budget_s}
        self.rows: list[dict] = []
        self.done: set = set()
        self.logits: dict = {}  # (kind, activations, format) -> the first prompt's logits, fp32 on the CPU

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def in_time(self) -> None:
        """Raise :class:`_OutOfTime` once the budget is spent."""
        if self.budget_s is not None and self.elapsed() > self.budget_s:
            raise _OutOfTime(f"the time budget of {self.budget_s:.0f} s was spent (at {self.elapsed():.0f} s); "
                             "lower-priority parts were not started")

    def _check(self, kind: str, act: str, fmt: str) -> dict:
        """The row's check of its model's logits against the bf16 peer's (measured first: see the module doc)."""
        ref = next(((k, v) for k, v in self.logits.items() if k[0] == "bf16-peer"), None)
        got = self.logits.get((kind, act, fmt))
        if got is None:
            return {"check": "no logits (the model was not loaded, or its check's forward failed)"}
        if kind == "bf16-peer":
            return {"logits_rel_err": 0.0, "check": "reference"}
        if ref is None:
            return {"check": "no reference logits (the bf16 peer was not measured before this model, or failed)"}
        tol = TOL["transformers-bf16" if kind == "transformers-bf16" else act]
        err = _rel_err(got, ref[1])
        return {"logits_ref": f"bf16-peer ({ref[0][2]})", "logits_rel_err": err, "logits_tol": tol,
                "check": "ok" if err <= tol else f"above tol: rel_err {err:.3g} > {tol}"}

    def add(self, key: tuple, status: str, head: dict | None = None, **fields) -> dict:
        """Make the row of the planned ``key`` (format, kind, activations, loop, cuda_graph, batch), hand it on."""
        fmt, kind, act, loop, cg, batch = key
        row = {**self.base, "model_kind": kind, "activations": act, "format": fmt, "label": LABELS[(kind, act)],
               **(head or {}), "loop": loop, "cuda_graph": cg, "batch": batch, **fields, "status": status,
               "run_elapsed_s": self.elapsed(), **self._check(kind, act, fmt)}
        self.rows.append(row)
        self.done.add(key)
        if self.sink is not None:
            self.sink(row)
        return row

    def rest(self, status: str, part: tuple | None = None, head: dict | None = None) -> None:
        """Rows with ``status`` for the planned keys not made yet (of one ``part``, (format, kind, activations), if
        given)."""
        for key in self.planned:
            if key not in self.done and (part is None or key[:3] == part):
                self.add(key, status, head)

    def _load(self, kind: str, act: str, ckpt: Path):
        from ..hf import from_pretrained

        if kind == "nvfp4":
            return from_pretrained(ckpt, activations=act, device=self.device)
        return load_bf16(ckpt, experts="peer" if kind == "bf16-peer" else "transformers", device=self.device)

    def measure(self, kind: str, act: str, fmt: str, head: dict, ckpt: Path) -> None:
        """Load one model, check its logits, decode every batch with each of its loops, free it."""
        dev, label, part, head = self.device, LABELS[(kind, act)], (fmt, kind, act), dict(head)
        self.in_time()
        _free()
        self.say(f"{fmt}: loading {label} ...")
        mem0 = torch.cuda.memory_allocated(dev) if self.graph else 0
        if self.graph:
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        try:
            model = self._load(kind, act, ckpt)
            _sync(dev)
        except Exception as e:  # any failure of one model is its rows' status: the others' rows are kept
            _unless_stopped(e)
            self.say(f"{fmt}: {label}: {_error(e)}")
            _free()
            self.rest(_error(e), part, head)
            return
        head["load_s"] = time.perf_counter() - t0
        if self.graph:
            head["loaded_gib"] = (torch.cuda.memory_allocated(dev) - mem0) / 2**30
            head["load_peak_gib"] = (torch.cuda.max_memory_allocated(dev) - mem0) / 2**30
        head.update(backend=getattr(model, "nvfp4_load_report", {}).get("backend", "torch"),
                    experts_implementation=getattr(model.config, "_experts_implementation", None),
                    attn_implementation=getattr(model.config, "_attn_implementation", None))
        self.say(f"{fmt}: {label} loaded in {head['load_s']:.1f} s" + (
            f", {head['loaded_gib']:.2f} GiB (peak while loading {head['load_peak_gib']:.2f} GiB)" if self.graph
            else ""))
        try:
            try:
                with torch.no_grad():
                    self.logits[(kind, act, fmt)] = model(input_ids=self.prompts[:1].to(dev),
                                                           use_cache=False).logits.float().cpu()
            except Exception as e:
                _unless_stopped(e)
                head["check_status"] = f"logits: {_error(e)}"
                self.say(f"{fmt}: {label}: the check's forward failed: {_error(e)}")
            for loop, cg in _loops(kind, self.graph, self.compiled):
                for b in self.batches:
                    self._decode(model, (fmt, kind, act, loop, cg, b), head)
        finally:
            del model
            _free()

    def _decode(self, model, key: tuple, head: dict) -> None:
        from ..hf import generate

        fmt, kind, act, loop, cuda_graph, batch = key
        what = f"{fmt}: {LABELS[(kind, act)]}, {loop} {'graphed' if cuda_graph else 'eager'}, batch {batch}"
        ids = self.prompts[:batch]
        profiled = None
        t0 = time.perf_counter()
        try:
            if loop == HF_GENERATE:
                stats = _hf_generate(model, ids.to(self.device), self.new_tokens, self.device)
                toks = stats.pop("tokens")
            else:
                inspect, profiled = self._profiler(model) if self.profile_steps and cuda_graph else (None, None)
                out, stats = generate(model, ids, self.new_tokens, cuda_graph=cuda_graph, compile=loop == COMPILED,
                                      exact_casts=bool(self.base["compile_exact_casts"]), inspect_step=inspect,
                                      inspect_steps=self._inspect_steps())
                toks = out[:, ids.shape[1]:].cpu()
                stats = {k: stats[k] for k in ("prefill_ms", "decode_s", "timed_steps", "steady_s", "tokens_per_s",
                                               "ms_per_token")} | {"decode_peak_gib": stats["peak_memory_gib"]}
        except Exception as e:
            _unless_stopped(e)
            self.say(f"{what}: {_error(e)}")
            self.add(key, _error(e), head, wall_s=time.perf_counter() - t0)
            return
        row = self.add(key, "ok", head, **stats, first_tokens=toks[0, :8].tolist(), wall_s=time.perf_counter() - t0)
        self.say(f"{what}: {row['tokens_per_s']:.1f} tokens/s, {row['ms_per_token']:.2f} ms per token "
                 f"({row['wall_s']:.0f} s with its compiles, capture{' and profile' if profiled else ''})")
        if profiled is not None:
            self._profile_rows(key, head, profiled, row["ms_per_token"])

    def _inspect_steps(self) -> int:
        """The decode steps :meth:`_profiler`'s inspect runs: profile_runner's first call and its replays, and
        module_profile's first call and its steps (generate's cache is made that much longer)."""
        return 1 + (self.profile_steps or 0) + 1 + MODULE_STEPS

    def _profiler(self, model):
        """(``inspect_step`` for :func:`~nvfp4lib.hf.generate`, the dict it fills: the step's profiles, or the
        error that stopped them: a failed profile leaves the decode row as it was)."""
        from .kernel_profile import module_profile, profile_runner, step_summary

        got = {}

        def inspect(eager, replay):
            t0 = time.perf_counter()
            try:
                got["graph"] = step_summary(profile_runner(replay, iters=self.profile_steps))
                got["eager-modules"] = module_profile(eager, model, iters=MODULE_STEPS)
            except Exception as e:  # a failed split by module keeps the graph's profile
                _unless_stopped(e)
                got["error"] = _error(e)
            got["profile_s"] = time.perf_counter() - t0

        return inspect, got

    def _profile_rows(self, key: tuple, head: dict, got: dict, ms_per_token: float) -> None:
        """The rows of one decode's profiles (the module doc), made with its key."""
        common = {"profile_iters": self.profile_steps, "profile_s": got.get("profile_s"),
                  "decode_ms_per_token": ms_per_token}
        if "error" in got:
            self.say(f"the profile failed: {got['error']}")
            self.add(key, f"profile {got['error']}", head,
                     profile="eager-modules" if "graph" in got else "graph", **common)
            if "graph" not in got:
                return
        g = got["graph"]
        step = {"step_kernels": g["kernels"], "step_sum_us": g["sum_us"], "step_span_us": g["span_us"],
                "step_gap_us": g["gap_us"]}
        for cat, v in g["categories"].items():
            self.add(key, "ok", head, profile="graph", category=cat, us_per_step=v["us"],
                     kernels_per_step=v["kernels"], **step, **common)
        for module, cats in got.get("eager-modules", {"modules": {}})["modules"].items():
            for cat, v in cats.items():
                self.add(key, "ok", head, profile="eager-modules", module=module, category=cat, us_per_step=v["us"],
                         kernels_per_step=v["kernels"], **{**common, "profile_iters": MODULE_STEPS})
        self.say(f"profile: {g['kernels']} kernels per step, {g['sum_us']:.0f} us of kernels in a span of "
                 f"{g['span_us']:.0f} us ({got['profile_s']:.0f} s)")


def _set_eager_fused(on: bool | None):
    """Set the serving kernel's EAGER_FUSED knob (None: leave it); returns the previous value and the knobs rows
    record, or (None, {}) where the kernel module does not import (no CuTe DSL)."""
    try:
        from ..kernels.hopper_varlen import kernel
    except Exception:
        return None, {}
    old = kernel.EAGER_FUSED
    if on is not None:
        kernel.EAGER_FUSED = on
    return old, {f"kernel_{k}": v for k, v in kernel.call_knobs().items()}


def bench_generate(*, preset: str = "qwen3-30b-a3b", formats=("modelopt", "compressed-tensors"),
                   activations=ACTIVATIONS, batches=BATCHES, kinds=KINDS, new_tokens: int = NEW_TOKENS,
                   prompt_tokens: int = PROMPT_TOKENS, seed: int = 0, device=None, workdir=None,
                   sizes: dict | None = None, eager_fused: bool | None = False, budget_s: float | None = None,
                   profile_steps: int | None = None, compiled: bool = False, compile_form: str = "opaque",
                   exact_casts: bool = False, sink=None, progress=print) -> list[dict]:
    """Rows (see the module doc) with provenance; nothing is stored here.

    ``preset``: :data:`PRESETS` (``tiny``: the CPU smoke test; ``sizes`` override a preset's fields, e.g.
    ``{"layers": 4}``); ``device``: default cuda if present, else cpu (reference backend, no CUDA graphs);
    ``workdir``: where the temporary checkpoints go (default: the system's temporary folder). ``eager_fused``: the
    serving kernel's ``EAGER_FUSED`` knob for the run (restored after; None: as shipped). Off by default here: the
    eager W4A4 calls (the check, prefill and warm-up steps) then run the captured form's kernels, so each config
    compiles once, not twice; the timed steps replay the graph, which runs those kernels either way.

    ``profile_steps``: replays of each graphed decode step to profile (the module doc; None: no profile).
    ``compiled``: each NVFP4 model and the bf16 peer also decode every batch with the step through torch.compile
    (loop :data:`COMPILED`; rows after the plain loop's, on the same loaded model). ``compile_form``: how torch.compile
    sees the NVFP4 modules (:mod:`nvfp4lib.nn.compiled`): "opaque" (one custom op each, running the eager forward; as
    shipped) or "traced" (their torch forms, compiled by Inductor); a compiled run's rows carry it. ``exact_casts``:
    the compiled step rounds where the eager code does (:data:`nvfp4lib.hf.generate.EXACT_CASTS`; rows carry
    ``compile_exact_casts``).

    ``budget_s``: write no checkpoint and load no model after this many seconds (a model loaded before decodes all its
    batches; the rows not measured say so). ``sink``: a
    callable given each row as soon as it is made (the command appends it to ``--out``). A stop (SIGTERM, raised by
    :func:`add_command`'s handler, or Ctrl-C) ends the run with a row for every planned row not measured."""
    from ..hf.checkpoint import FORMATS
    from ..hf.writer import PRESETS as SIZES
    from ..hf.writer import checkpoint_bytes, make_checkpoint

    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {PRESETS}, got {preset!r}")
    if compile_form not in COMPILE_FORMS:
        raise ValueError(f"compile_form must be one of {COMPILE_FORMS}, got {compile_form!r}")
    for name, given, known in (("format", formats, FORMATS), ("activations", activations, ACTIVATIONS),
                               ("model kind", kinds, KINDS)):
        bad = [x for x in given if x not in known]
        if bad:
            raise ValueError(f"{name} {bad[0]!r} is not one of {known}")
    if not formats or not batches or min(batches) < 1:
        raise ValueError(f"name at least one format and batches >= 1 (got formats {list(formats)}, batches "
                         f"{list(batches)})")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s}")
    if profile_steps is not None and profile_steps < 2:
        raise ValueError(f"profile_steps must be >= 2 replays, got {profile_steps}")
    if new_tokens < 8:
        raise ValueError(f"new_tokens must be >= 8 (the first steps are warm-up and capture, not timed), got "
                         f"{new_tokens}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda" and preset != "tiny":
        raise ValueError(f"the {preset} preset is measured on a CUDA GPU (none here, or device={str(device)!r}); "
                         "--preset tiny runs on the CPU (reference backend, no CUDA graphs)")
    if profile_steps and device.type != "cuda":
        raise ValueError(f"profile_steps profiles a CUDA graph's replays: it needs a CUDA GPU (device={str(device)!r})")
    for module in ("transformers", "safetensors"):
        try:
            __import__(module)
        except ImportError:
            raise ImportError(f"generate-bench needs {module} (the hf extra: pip install -e '.[hf]')") from None
    t_start = time.perf_counter()

    def say(msg: str) -> None:
        if progress:
            progress(f"[{time.perf_counter() - t_start:7.1f} s] {msg}")

    shape = {**SIZES[preset], **(sizes or {})}
    shape.pop("arch", None)
    prompts = torch.randint(0, shape["vocab"], (max(batches), prompt_tokens),
                            generator=torch.Generator().manual_seed(seed + 1))
    old_fused, knobs = _set_eager_fused(eager_fused) if device.type == "cuda" else (None, {})
    base = {"run_id": new_run_id(), **provenance(device if device.type == "cuda" else None),
            "transformers": _transformers_version(), "bench": "generate", "preset": preset,
            **{f"model_{k}": v for k, v in shape.items() if k in ("layers", "hidden", "experts", "moe_intermediate",
                                                                 "top_k", "heads", "kv_heads", "head_dim", "vocab")},
            "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "seed": seed, "device_type": device.type,
            "profile_steps": profile_steps, "compile_form": compile_form if compiled else None,
            "compile_exact_casts": bool(exact_casts) if compiled else None, **knobs}
    plan = _plan(formats, activations, kinds)
    run = _Run(base, device, batches, prompts, new_tokens, say, plan, budget_s, sink, t_start, profile_steps,
               compiled)
    stop = None
    try:
        with knob_setting("nvfp4lib.nn.compiled", "OPAQUE", compile_form == "opaque"):
            for fmt, want in plan:
                run.in_time()
                tmp = Path(tempfile.mkdtemp(prefix=f"nvfp4lib-generate-{fmt}-", dir=workdir))
                try:
                    say(f"{fmt}: writing the {preset} checkpoint to {tmp} ...")
                    t0 = time.perf_counter()
                    try:
                        ckpt = make_checkpoint(tmp / "model", fmt=fmt, preset=preset, seed=seed, device=device,
                                               **(sizes or {}))
                        _sync(device)
                    except Exception as e:
                        _unless_stopped(e)
                        say(f"{fmt}: writing the checkpoint failed: {_error(e)}")
                        for kind, act in want:
                            run.rest(f"checkpoint {_error(e)}", (fmt, kind, act))
                        continue
                    finally:
                        _free()
                    head = {"checkpoint_gib": checkpoint_bytes(ckpt) / 2**30,
                            "checkpoint_write_s": time.perf_counter() - t0}
                    say(f"{fmt}: written in {head['checkpoint_write_s']:.1f} s ({head['checkpoint_gib']:.2f} GiB)")
                    for kind, act in want:
                        run.measure(kind, act, fmt, head, ckpt)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    except _OutOfTime as e:
        stop = f"skipped: {e}"
    except (KeyboardInterrupt, _Interrupted) as e:
        stop = f"not reached: the run was stopped ({str(e) or type(e).__name__}) after {run.elapsed():.0f} s"
    finally:
        if old_fused is not None:
            _set_eager_fused(old_fused)
    if stop:
        say(stop + "; the rows measured so far are kept")
        run.rest(stop)
    return run.rows


def _transformers_version() -> str | None:
    try:
        import transformers

        return transformers.__version__
    except ImportError:
        return None


# --------------------------------------------------------------------------------------------------- command

def _print_profile(rows: list[dict]) -> None:
    """The --profile-step rows of the graph replays: per model and batch, each category's GPU time per step."""
    rows = [r for r in rows if r.get("profile") == "graph" and r["status"] == "ok"]
    if rows:
        print(f"\n{'model':<18} {'batch':>5} {'category':<20} {'us/step':>9} {'kernels':>8}")
    for r in rows:
        print(f"{r['label']:<18} {r['batch']:>5} {r['category']:<20} {r['us_per_step']:9.1f} "
              f"{r['kernels_per_step']:8.0f}")


def _print_table(rows: list[dict]) -> None:
    profiled, rows = rows, [r for r in rows if not r.get("profile")]
    print(f"\n{'format':<19} {'model':<18} {'loop':<22} {'graph':<6} {'batch':>5} {'tokens/s':>10} {'ms/token':>9} "
          f"{'loaded GiB':>10} {'rel err':>9}  status")
    for r in rows:
        tps = f"{r['tokens_per_s']:10.1f}" if r.get("tokens_per_s") is not None else f"{'-':>10}"
        ms = f"{r['ms_per_token']:9.2f}" if r.get("ms_per_token") is not None else f"{'-':>9}"
        gib = f"{r['loaded_gib']:10.2f}" if r.get("loaded_gib") is not None else f"{'-':>10}"
        err = f"{r['logits_rel_err']:9.2e}" if r.get("logits_rel_err") is not None else f"{'-':>9}"
        print(f"{r['format']:<19} {r['label']:<18} {r['loop']:<22} {str(r['cuda_graph']):<6} {r['batch']:>5} {tps} "
              f"{ms} {gib} {err}  {r['status'][:50]}; check: {r.get('check', '-')[:40]}")
    _print_profile(profiled)


def add_command(sub, add_record_args, write) -> None:
    """``python -m nvfp4lib generate-bench``: the parser and the command, registered on ``sub`` (argparse
    subparsers)."""
    from .store import GENERATE

    p = sub.add_parser("generate-bench", help="decode a random NVFP4 checkpoint against the same model in bf16 "
                                              "(GPU; --preset tiny runs on the CPU); rows to build/ (data/ with "
                                              "--record)")
    p.add_argument("--preset", choices=list(PRESETS), default="qwen3-30b-a3b")
    p.add_argument("--layers", type=int, help="override the preset's decoder layers (a quick GPU check: e.g. 4)")
    p.add_argument("--format", dest="formats", nargs="+", choices=["modelopt", "compressed-tensors"],
                   default=["modelopt", "compressed-tensors"],
                   help="checkpoint formats, one checkpoint each (written, measured, deleted in turn), in this "
                        "order; the bf16 peer is built from the first one's, transformers' model from the last one's")
    p.add_argument("--batch", dest="batches", nargs="+", type=int, default=list(BATCHES))
    p.add_argument("--activations", nargs="+", choices=list(ACTIVATIONS), default=list(ACTIVATIONS),
                   help="the NVFP4 model's: nvfp4 (W4A4), bf16 (W4A16)")
    p.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS), help="model kinds to measure")
    p.add_argument("--new-tokens", type=int, default=NEW_TOKENS,
                   help="tokens decoded per run; the first four (prefill, two warm-up steps, the capture) are not "
                        "timed")
    p.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS,
                   help="prompt length (the default keeps the prefill in the decode steps' kernel configs: fewer "
                        "compiles)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", help="default: cuda if present, else cpu")
    p.add_argument("--workdir", type=Path, help="where the temporary checkpoints go (default: the system's "
                                                "temporary folder; the Qwen3-30B-A3B shape needs ~17 GB free)")
    p.add_argument("--eager-fused", choices=["on", "off", "shipped"], default="off",
                   help="the serving kernel's EAGER_FUSED knob for the run (rows carry it): off (default here) "
                        "compiles each W4A4 config once, for eager and captured calls alike; the timed steps replay "
                        "the graph either way")
    p.add_argument("--budget-s", type=float,
                   help="write no checkpoint and load no model after this many seconds (parts run in priority "
                        "order: the targets' first); each row not measured says why. Under `timeout`, leave room for "
                        "the part that is running (e.g. `timeout -k 30 560 ... --budget-s 480`): a SIGTERM keeps "
                        "every row measured too (each is appended to --out as it is made)")
    p.add_argument("--profile-step", type=int, metavar="N", dest="profile_steps",
                   help="after each graphed decode, profile its step: N graph replays under the profiler (GPU time "
                        f"per kernel category) and {MODULE_STEPS} eager steps split by module; rows with a `profile` "
                        "field (GPU only; e.g. 20)")
    p.add_argument("--compile", action="store_true",
                   help="each NVFP4 model and the bf16 peer also decode every batch with the step through "
                        "torch.compile (rows with loop 'nvfp4lib.hf.generate + torch.compile'; compiled once per "
                        "model and batch, not timed)")
    p.add_argument("--compile-form", choices=list(COMPILE_FORMS), default="opaque",
                   help="--compile: the NVFP4 modules as one opaque custom op each, running their eager forward "
                        "(opaque, as shipped), or traced into their torch forms (traced); rows carry compile_form")
    p.add_argument("--exact-casts", action="store_true",
                   help="--compile: Inductor rounds where the eager code does (emulate_precision_casts; "
                        "nvfp4lib.hf.generate.EXACT_CASTS), so the compiled step can decode the plain step's tokens; "
                        "rows carry compile_exact_casts")
    add_record_args(p, GENERATE, "generate")

    def run(args) -> int:
        import copy
        import signal

        from .store import append_rows

        def stop(signum, frame):
            raise _Interrupted(signal.Signals(signum).name)

        old = signal.signal(signal.SIGTERM, stop)  # `timeout` sends SIGTERM: keep what was measured
        try:
            rows = bench_generate(preset=args.preset, formats=tuple(args.formats), activations=tuple(args.activations),
                                  batches=tuple(args.batches), kinds=tuple(args.kinds), new_tokens=args.new_tokens,
                                  prompt_tokens=args.prompt_tokens, seed=args.seed, device=args.device,
                                  workdir=args.workdir, sizes={"layers": args.layers} if args.layers else None,
                                  eager_fused={"on": True, "off": False, "shipped": None}[args.eager_fused],
                                  budget_s=args.budget_s, profile_steps=args.profile_steps,
                                  compiled=args.compile, compile_form=args.compile_form,
                                  exact_casts=args.exact_casts,
                                  progress=lambda m: print(m, flush=True),
                                  sink=(lambda row: append_rows(args.out, [row])) if args.out else None)
        except (ValueError, ImportError) as e:  # refused before measuring anything
            print(f"generate-bench: {e}")
            return 2
        finally:
            signal.signal(signal.SIGTERM, old)
        _print_table(rows)
        if args.out:
            print(f"\nthe {len(rows)} rows were appended to {args.out} as they were made")
        rest = copy.copy(args)
        rest.out = None  # (--out has them already)
        write(rest, rows, GENERATE.name)
        # transformers' capture may fail (its row says how); every other row must have measured and passed its check
        ok = all(r["status"] == "ok" for r in rows if not (r["loop"] == STATIC and r["cuda_graph"]
                                                          and r["model_kind"] == "transformers-bf16"))
        checked = all(r.get("check") in ("ok", "reference") for r in rows)
        return 0 if rows and ok and checked else 1

    p.set_defaults(fn=run)
