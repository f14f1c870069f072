"""Greedy decoding with a static KV cache, timed: the serving loop a loaded checkpoint runs.

:func:`generate` prefills the prompt (in one forward, or in chunks of ``prefill_chunk`` positions), then decodes one
token per step for the whole batch. The cache is transformers' ``StaticCache`` (its shapes never change, so a step's
tensors keep their addresses). With ``cuda_graph=True`` the decode step (the whole model: attention, NVFP4 Linears,
the MoE layers) is captured once as one CUDA graph after two eager warm-up steps on a side stream, and replayed for
every later step; only the token and its position are copied in. The stats row gives decode tokens/s (batch · steps /
time) and the time per step over the steady-state steps (those after the warm-up steps and the capture: a first call's
compiles, tuning and the capture itself are left out; eager decoding leaves the same steps out, so both forms are
timed alike), the whole decode time, the prefill time and the peak GPU memory of the run.

``inspect_step`` (for a profiler, e.g. ``generate-bench --profile-step``) is called once after the last step and the
stats, with two zero-argument callables: one eager decode step, and the captured graph's replay (None without
``cuda_graph``). Each call decodes one more position with the last token: transformers' ``StaticCache`` (5.x) keeps its
own position counter on the device and ignores the ``cache_position`` passed to it, so every step, the captured one
included, writes the next entry. The cache is therefore allocated ``inspect_steps`` positions longer than the decode
needs, and the callables refuse (RuntimeError) a call past that room; without the room, a profiler's extra steps
wrote past the cache's end (a device-side ``index_copy_`` assert, seen on the H100 with ``--profile-step 20``). The
timed steps attend over the longer cache (its unused entries masked), a little more work per step than without an
``inspect_step``.

With ``compile=True`` the decode step's forward runs through ``torch.compile`` (Inductor; ``dynamic=False``: a
decode step's shapes never change), so transformers' norms, rotary embedding, router and elementwise kernels around
the NVFP4 layers are fused where Inductor can; the NVFP4 layers are one opaque custom op each, running their eager
forward (:mod:`nvfp4lib.nn.compiled`). The compile happens in the first warm-up step (seconds to minutes: not timed);
a graphed run captures the compiled step. The prefill stays eager (its shapes differ per prompt). Inductor computes a
fused chain of ops in fp32 and rounds once where the eager code rounds to bf16 between them, so the compiled step's
bits differ from the plain step's, and W4A4, which turns a one-ulp change of a layer's input into other E2M1 codes,
can decode other greedy tokens. ``exact_casts=True`` (:data:`EXACT_CASTS`) compiles with Inductor's
``emulate_precision_casts``, which rounds where the eager code does: on the CPU the compiled step then gives the eager
step's bits (tests/test_compiled.py).

An expert-parallel model (``from_pretrained(..., ep_group=)``, :mod:`.ep`) decodes this rank's batch while the other
ranks decode theirs, every rank calling generate with the same shapes: the ranks' shapes are checked against each
other first (one all-gather; a mismatch raises ValueError on every rank, before any step), a batch larger than the
model's ``ep_capacity`` is refused on every rank, and the prompt is prefilled in chunks of at most ``ep_capacity //
batch`` positions, so every forward fits the capacity and the ranks step in lockstep. ``cuda_graph=True`` captures the
EP layers' collectives with the rest (both transports are capturable). The stats add ``ep_world``, the ``global_batch``
and ``global_tokens_per_s`` (all ranks' tokens over the slowest rank's time).
"""
from __future__ import annotations

import inspect
import time
from typing import NamedTuple

import torch

__all__ = ["generate", "Generation"]

WARMUP_STEPS = 2  # eager decode steps before the capture (lazy allocations, compiles, tuning lookups)
# the first decode step timed: after the warm-up steps and the step that captures (with max_new_tokens too small to
# leave a step after it, every decode step is timed)
TIMED_FROM = WARMUP_STEPS + 2


INSPECT_STEPS = 64  # inspect_step's default room: decode steps past max_new_tokens that the cache holds
# generate(compile=True)'s default for exact_casts (the module doc). Off: the form measured on a GPU. Prediction
# (2026-11-28, before a GPU run; the 48-layer Qwen3-30B-A3B shape, W4A4, the opaque modules): on, the compiled
# model's greedy tokens equal its plain graphed loop's (off, they moved after the first token on the H100), at the
# same tokens/s within 3% (a few more roundings in memory-bound fused kernels). The A/B: generate-bench --compile,
# then the same with --exact-casts.
EXACT_CASTS = False


def _counted(room: int, *fns):
    """``fns`` (None kept) sharing one budget of ``room`` calls: a call past it raises RuntimeError before it runs (it
    would write past the cache's end)."""
    used = [0]

    def wrap(fn):
        def call():
            if used[0] >= room:
                raise RuntimeError(f"inspect_step ran more than inspect_steps = {room} decode steps: the cache has "
                                   "room for no more; pass a larger inspect_steps to generate")
            used[0] += 1
            return fn()
        return call

    return [None if fn is None else wrap(fn) for fn in fns]


class Generation(NamedTuple):
    tokens: torch.Tensor  # int64 [B, P + N]: the prompt then the N generated tokens
    stats: dict  # one row: tokens_per_s, ms_per_token, prefill_ms, peak_memory_gib, ...


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, *, cuda_graph: bool = False,
             compile: bool = False, exact_casts: bool | None = None, prefill_chunk: int | None = None,
             progress: bool = False, inspect_step=None, inspect_steps: int = INSPECT_STEPS) -> Generation:
    """Greedy-decode ``max_new_tokens`` tokens after ``input_ids`` (int ``[B, P]``, or ``[P]`` for one sequence).
    ``prefill_chunk``: positions per prefill forward (default: the whole prompt; an expert-parallel model caps it at
    its capacity, see the module doc). ``compile``: the decode step's forward through ``torch.compile`` (the prefill
    stays eager; see the module doc); ``exact_casts``: with it, Inductor rounds where the eager code does (None:
    :data:`EXACT_CASTS`). ``inspect_step``, ``inspect_steps`` (the most steps it may run): see the module
    doc."""
    from transformers import StaticCache

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = next(t.device for t in model.parameters())
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [B, P] with P >= 1, got {tuple(ids.shape)}")
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True needs the model on a CUDA device, not {device}")
    if inspect_step is not None and inspect_steps < 1:
        raise ValueError(f"inspect_steps must be >= 1 (the steps inspect_step may run), got {inspect_steps}")
    if prefill_chunk is not None and prefill_chunk < 1:
        raise ValueError(f"prefill_chunk must be >= 1 positions, got {prefill_chunk}")
    ids = ids.to(device)
    batch, prompt = ids.shape
    chunk = min(prefill_chunk or prompt, prompt)
    ep = getattr(model, "nvfp4_ep", None)
    if compile and ep is not None:
        raise ValueError("generate(compile=True) with an expert-parallel model is not supported (its collectives "
                         "under torch.compile are untried): decode it without compile")
    if ep is not None:
        ep.require_same(batch=batch, prompt_tokens=prompt, max_new_tokens=max_new_tokens, cuda_graph=int(cuda_graph),
                        prefill_chunk=chunk)
        if batch > ep.capacity:
            raise ValueError(f"a decode step of {batch} sequences runs {batch} tokens per rank, more than the "
                             f"model's ep_capacity = {ep.capacity}: load it with ep_capacity >= {batch} or decode "
                             "fewer sequences per rank")
        chunk = min(chunk, ep.capacity // batch)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    room = inspect_steps if inspect_step is not None else 0
    cache = StaticCache(config=model.config, max_cache_len=prompt + max_new_tokens + room)
    # transformers 5.24 renamed the forward's past_key_values to cache (the old name warns until 5.40)
    kv = {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}
    out = torch.empty((batch, max_new_tokens), dtype=torch.long, device=device)

    _sync(device)
    t0 = time.perf_counter()
    for start in range(0, prompt, chunk):
        end = min(start + chunk, prompt)
        logits = model(input_ids=ids[:, start:end], **kv, use_cache=True,
                       cache_position=torch.arange(start, end, device=device), logits_to_keep=1).logits
    out[:, 0] = logits[:, -1].argmax(-1)
    _sync(device)
    t1 = time.perf_counter()

    tok = torch.empty((batch, 1), dtype=torch.long, device=device)
    pos = torch.empty((1,), dtype=torch.long, device=device)
    nxt = torch.empty((batch,), dtype=torch.long, device=device)

    exact_casts = EXACT_CASTS if exact_casts is None else bool(exact_casts)
    options = {"emulate_precision_casts": True} if exact_casts else None
    forward = torch.compile(model, dynamic=False, options=options) if compile else model  # compiled at the first step

    def step():
        lg = forward(input_ids=tok, **kv, use_cache=True, cache_position=pos).logits
        nxt.copy_(lg[:, -1].argmax(-1))

    graph, side = None, None
    timed_from = TIMED_FROM if max_new_tokens > TIMED_FROM else 1
    t_steady = t1
    steps = range(1, max_new_tokens)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="decoding", unit="step", total=max_new_tokens - 1)
    for i in steps:
        if i == timed_from and i > 1:
            _sync(device)
            t_steady = time.perf_counter()
        tok.copy_(out[:, i - 1: i])
        pos.fill_(prompt + i - 1)
        if not cuda_graph:
            step()
        elif graph is not None:
            graph.replay()
        elif i <= WARMUP_STEPS:
            side = side or torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                step()
            torch.cuda.current_stream(device).wait_stream(side)
        else:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    step()
            except RuntimeError as e:
                raise RuntimeError(f"generate(cuda_graph=True): the decode step could not be captured ({e}); run "
                                   "without cuda_graph") from e
            graph.replay()
        out[:, i] = nxt
    _sync(device)
    t2 = time.perf_counter()

    steps_n = max_new_tokens - timed_from  # the steady-state steps
    steady_s = t2 - t_steady
    stats = {
        "batch": batch, "prompt_tokens": prompt, "new_tokens": max_new_tokens, "cuda_graph": cuda_graph,
        "compiled": compile, "exact_casts": exact_casts if compile else None,
        "prefill_steps": -(-prompt // chunk),
        "prefill_ms": (t1 - t0) * 1e3,
        "decode_s": t2 - t1,
        "timed_steps": steps_n,
        "steady_s": steady_s,
        "tokens_per_s": batch * steps_n / steady_s if steps_n and steady_s > 0 else float("nan"),
        "ms_per_token": steady_s / steps_n * 1e3 if steps_n else float("nan"),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
    }
    if ep is not None:  # every rank's tokens over the slowest rank's steady-state time
        slowest = float(ep.gathered([steady_s])[:, 0].max())
        stats.update(ep_world=ep.world, ep_transport=ep.transport, ep_capacity=ep.capacity,
                     global_batch=batch * ep.world,
                     global_tokens_per_s=batch * ep.world * steps_n / slowest if steps_n and slowest > 0
                     else float("nan"))
    report = getattr(model, "nvfp4_load_report", None)
    if report:
        stats.update(model=report["path"], format=report["format"], activations=report["activations"],
                     backend=report["backend"])
    if inspect_step is not None:
        inspect_step(*_counted(room, step, graph.replay if graph is not None else None))
    return Generation(torch.cat([ids, out], dim=1), stats)
