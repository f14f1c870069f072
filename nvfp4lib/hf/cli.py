"""The checkpoint commands: ``make-checkpoint`` (write a random NVFP4 checkpoint) and ``generate`` (load one, decode
greedily, print the speed). :func:`add_commands` registers both on an argparse sub-parser set; each command's
``func`` takes the parsed namespace and returns an exit code.

``generate --ep W`` runs under ``torchrun --nproc_per_node W`` (expert parallelism, :mod:`.ep`): each rank joins the
process group (NCCL on GPU ``LOCAL_RANK``, gloo on the CPU; ``--ep-timeout`` bounds every collective), loads its
experts, and decodes its ``--batch / W`` of the sequences in lockstep with the others; rank 0 prints."""
from __future__ import annotations

import argparse
import json
import os

__all__ = ["add_commands", "cmd_make_checkpoint", "cmd_generate"]


def add_commands(subparsers) -> None:
    from ..nn.ep import TRANSPORTS
    from .archs import ARCHS
    from .checkpoint import FORMATS
    from .writer import PRESETS

    p = subparsers.add_parser("make-checkpoint", help="write a randomly initialised NVFP4 checkpoint (no download)",
                              description="Write a randomly initialised NVFP4 checkpoint folder as ModelOpt or "
                                          "compressed-tensors export one: config.json, the quantization config, "
                                          "sharded safetensors with an index.")
    p.add_argument("out", help="the checkpoint folder to write")
    p.add_argument("--arch", choices=list(ARCHS), default="qwen3_moe")
    p.add_argument("--format", dest="fmt", choices=list(FORMATS), default="modelopt")
    p.add_argument("--preset", choices=list(PRESETS), default="tiny",
                   help="sizes to start from (the flags below override them); qwen3-30b-a3b sets --arch qwen3_moe")
    for flag, what in (("layers", "decoder layers"), ("hidden", "hidden size"), ("experts", "routed experts"),
                       ("moe-intermediate", "expert intermediate size"),
                       ("intermediate", "dense MLP intermediate size (DeepSeek-V3's dense layers)"),
                       ("heads", "attention heads"), ("kv-heads", "key/value heads"), ("head-dim", "head dim"),
                       ("vocab", "vocabulary size"), ("top-k", "experts per token")):
        p.add_argument(f"--{flag}", type=int, help=what)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where to draw and quantize the weights (cuda is much faster "
                                                   "for large models)")
    p.add_argument("--shard-gib", type=float, default=2.0, help="safetensors shard size")
    p.add_argument("--distinct-scales", action="store_true",
                   help="give gate/up and q/k/v their own per-tensor scales (exporters share them)")
    p.set_defaults(fn=cmd_make_checkpoint)

    g = subparsers.add_parser("generate", help="load an NVFP4 checkpoint and decode greedily, timed",
                              description="Load an NVFP4 checkpoint (nvfp4lib.hf.from_pretrained) and greedy-decode "
                                          "with a static KV cache; prints tokens/s, time per token and peak memory.")
    g.add_argument("model_dir")
    g.add_argument("--prompt-ids", default="1,2,3,4", help="comma-separated token ids of the prompt")
    g.add_argument("--max-new-tokens", type=int, default=32)
    g.add_argument("--activations", choices=["nvfp4", "bf16"], default="nvfp4")
    g.add_argument("--cuda-graph", action="store_true", help="replay each decode step as one CUDA graph")
    g.add_argument("--compile", action="store_true", help="the decode step through torch.compile (compiled in the "
                   "first warm-up step; with --cuda-graph the compiled step is captured)")
    g.add_argument("--exact-casts", action="store_true", help="with --compile: Inductor rounds where the eager code "
                   "does (the compiled step's bits are the plain step's where it can; see nvfp4lib.hf.generate)")
    g.add_argument("--batch", type=int, default=1, help="sequences decoded together (the prompt repeated); with "
                   "--ep W, over all ranks (a multiple of W)")
    g.add_argument("--device", default=None, help="default: cuda if available (with --ep: cuda:LOCAL_RANK), else cpu "
                   "(reference backend)")
    g.add_argument("--ep", type=int, metavar="W", help="expert parallelism over W ranks: run under torchrun "
                   "--nproc_per_node W; each rank holds E/W experts of every MoE layer and decodes --batch/W sequences")
    g.add_argument("--ep-capacity", type=int, help="tokens a rank runs per step, which sizes the EP buffers (default: "
                   "its sequences times the prompt length, so the prompt is prefilled in one step; smaller prefills "
                   "in chunks)")
    g.add_argument("--ep-transport", choices=list(TRANSPORTS), default="all-gather", help="how the MoE layers "
                   "exchange tokens (symm-mem: CUDA only)")
    g.add_argument("--ep-timeout", type=float, default=300.0, help="seconds a collective waits for the other ranks "
                   "before failing (init_process_group's timeout)")
    g.add_argument("--json", action="store_true", help="print the stats row as JSON")
    g.set_defaults(fn=cmd_generate)


def cmd_make_checkpoint(args: argparse.Namespace) -> int:
    from .writer import checkpoint_bytes, make_checkpoint

    names = {"layers": "layers", "hidden": "hidden", "experts": "experts", "moe_intermediate": "moe_intermediate",
             "intermediate": "intermediate", "heads": "heads", "kv_heads": "kv_heads", "head_dim": "head_dim",
             "vocab": "vocab", "top_k": "top_k"}
    sizes = {k: getattr(args, a) for a, k in names.items() if getattr(args, a, None) is not None}
    out = make_checkpoint(args.out, arch=args.arch, fmt=args.fmt, preset=args.preset, seed=args.seed,
                          device=args.device, shard_bytes=int(args.shard_gib * 2**30),
                          shared_scales=not args.distinct_scales, progress=True, **sizes)
    print(f"wrote {out} ({checkpoint_bytes(out) / 2**30:.2f} GiB of safetensors, {args.fmt})")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from .loader import from_pretrained

    try:
        prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}") from None
    if not prompt:
        raise SystemExit("--prompt-ids is empty")
    if args.ep is None:
        if args.ep_capacity is not None:
            raise SystemExit("--ep-capacity needs --ep W (expert parallelism)")
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = from_pretrained(args.model_dir, activations=args.activations, device=device, progress=True)
        return _decode(model, prompt, args.batch, args, show=True)
    import torch.distributed as dist

    batch, device = _join_ep_group(args)
    try:
        capacity = args.ep_capacity or batch * len(prompt)
        model = from_pretrained(args.model_dir, activations=args.activations, device=device, ep_group=dist.group.WORLD,
                                ep_capacity=capacity, ep_transport=args.ep_transport, progress=dist.get_rank() == 0)
        return _decode(model, prompt, batch, args, show=dist.get_rank() == 0)
    finally:
        dist.destroy_process_group()


def _join_ep_group(args: argparse.Namespace):
    """``--ep W`` under torchrun: check the launch, join the group; this rank's (batch, device)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    w = args.ep
    if w < 1:
        raise SystemExit(f"--ep must be >= 1 ranks, got {w}")
    env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if None in env.values():
        raise SystemExit(f"--ep {w} runs one process per rank: launch it as torchrun --nproc_per_node {w} -m nvfp4lib "
                         f"generate ... (RANK, WORLD_SIZE, LOCAL_RANK are not all set)")
    if int(env["WORLD_SIZE"]) != w:
        raise SystemExit(f"--ep {w}, but torchrun started WORLD_SIZE = {env['WORLD_SIZE']} processes")
    if args.batch % w:
        raise SystemExit(f"--batch {args.batch} must be a multiple of --ep {w} (each rank decodes batch / W sequences)")
    if args.ep_capacity is not None and args.ep_capacity < 1:
        raise SystemExit(f"--ep-capacity must be >= 1 tokens, got {args.ep_capacity}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    timeout = timedelta(seconds=args.ep_timeout)
    if device.type == "cuda":
        device = torch.device("cuda", int(env["LOCAL_RANK"]) if device.index is None else device.index)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    return args.batch // w, device


def _decode(model, prompt: list[int], batch: int, args: argparse.Namespace, show: bool) -> int:
    import torch

    from .generate import generate

    ids = torch.tensor([prompt] * batch)
    tokens, stats = generate(model, ids, args.max_new_tokens, cuda_graph=args.cuda_graph, compile=args.compile,
                             exact_casts=args.exact_casts,
                             progress=show)
    if not show:
        return 0
    print("tokens:", tokens[0, len(prompt):].tolist())
    if args.json:
        print(json.dumps(stats))
        return 0
    peak = stats["peak_memory_gib"]
    line = (f"{stats['tokens_per_s']:.1f} tokens/s, {stats['ms_per_token']:.2f} ms per token (batch {batch}), "
            f"prefill {stats['prefill_ms']:.1f} ms, peak memory "
            + (f"{peak:.2f} GiB" if peak is not None else "n/a (CPU)") + f" on {stats['device']}")
    if "ep_world" in stats:
        line = (f"{stats['global_tokens_per_s']:.1f} tokens/s over {stats['ep_world']} ranks (batch "
                f"{stats['global_batch']}, {stats['ep_transport']}); rank 0: " + line)
    print(line)
    return 0
