"""Expert-parallel loading (issue 42) on the CPU: ``from_pretrained(..., ep_group=)`` on 2 gloo processes (spawned,
joined with a timeout), backend "reference", tiny checkpoints written by nvfp4lib.hf.make_checkpoint (Qwen3-MoE and
Mixtral in ModelOpt and compressed-tensors, DeepSeek-V3 with its shared expert and dense layer in ModelOpt), against
the single-process model loaded in the same process:

- logits of the EP model on each rank's batch are bit-identical to the single-process model's on those sequences, in
  W4A16 and W4A4 (the tolerance is zero, and why: with the checkpoint's static activation scales a token's MoE output
  does not depend on the other tokens of the step; the reference backend's GEMM rows do not depend on the other rows
  (tests/test_ep.py); the all-gather transport's combine of top-2 copies has one summation order; the rest of the
  model runs the same shapes on both) — also when the ranks run batches of different shapes in one step;
- greedy generation with the prefill chunked by the capacity equals the single-process generation chunked alike;
- the tensors read from disk (the checkpoint reader wrapped, every tensor name recorded): exactly the single-process
  load's minus the other rank's experts; each MoE layer holds E/W experts;
- the capacity and lockstep errors (a forward over capacity, a batch over capacity, ranks with different shapes),
  argument errors, and ``generate --ep 2`` as torchrun launches it (rank 0 prints).
"""
import argparse
import contextlib
import io
import os
from datetime import timedelta

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from nvfp4lib.hf import from_pretrained, generate, make_checkpoint  # noqa: E402
from nvfp4lib.hf.archs import ARCHS, EXPERT_RE  # noqa: E402
from nvfp4lib.hf.checkpoint import Checkpoint, read_config  # noqa: E402
from nvfp4lib.hf.cli import add_commands  # noqa: E402
from nvfp4lib.hf.modules import NVFP4Experts  # noqa: E402
from nvfp4lib.nn import EPMoE  # noqa: E402
from tests.ranks import free_port, run_ranks  # noqa: E402

W, CAP = 2, 32
TIMEOUT_S = 80
CASES = [("qwen3_moe", "modelopt"), ("qwen3_moe", "compressed-tensors"), ("mixtral", "compressed-tensors"),
         ("mixtral", "modelopt"), ("deepseek_v3", "modelopt")]


class _Recorder:
    """A safetensors handle that records every tensor name read through it."""

    def __init__(self, handle, reads: set):
        self.handle, self.reads = handle, reads

    def keys(self):
        return self.handle.keys()

    def get_tensor(self, name):
        self.reads.add(name)
        return self.handle.get_tensor(name)

    def get_slice(self, name):
        self.reads.add(name)
        return self.handle.get_slice(name)


def _record_reads() -> set:
    reads = set()
    handle = Checkpoint._handle
    Checkpoint._handle = lambda self, file: _Recorder(handle(self, file), reads)
    return reads


def _expert_of(path, name: str) -> int | None:
    m = EXPERT_RE.match(ARCHS[read_config(path)["model_type"]].to_model(name.rpartition(".")[0]))
    return int(m["e"]) if m else None


def _check_reads(path, ep_reads: set, single_reads: set, mine: range) -> None:
    foreign = sorted(n for n in ep_reads if _expert_of(path, n) not in (None, *mine))
    assert not foreign, f"read other ranks' expert tensors: {foreign[:3]}"
    want = {n for n in single_reads if _expert_of(path, n) in (None, *mine)}
    assert ep_reads == want, (sorted(want - ep_reads)[:3], sorted(ep_reads - want)[:3])


def _ids(rank: int, shapes) -> torch.Tensor:
    """This rank's sequences: ``shapes[rank] = (B, S)``, drawn from a seed shared by the ranks."""
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, 128, s, generator=g) for s in shapes][rank]


def _both_raise(exc, match, fn):
    with pytest.raises(exc, match=match):
        fn()


def _worker(rank: int, port: int, cli_port: int, paths: list) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=W, timeout=timedelta(seconds=60))
    group = dist.group.WORLD
    reads = _record_reads()
    try:
        for path in paths:
            for activations in ("bf16", "nvfp4"):
                what = f"{path.name} {activations}"
                reads.clear()
                ep = from_pretrained(path, device="cpu", activations=activations, ep_group=group, ep_capacity=CAP)
                ep_reads = set(reads)
                reads.clear()
                single = from_pretrained(path, device="cpu", activations=activations)
                layers = [m.moe for m in ep.modules() if isinstance(m, NVFP4Experts)]
                assert layers and all(isinstance(m, EPMoE) for m in layers), what
                mine = layers[0].expert_range
                assert all(m.local.experts == m.experts // W and m.expert_range == mine for m in layers), what
                _check_reads(path, ep_reads, set(reads), mine)
                assert ep.nvfp4_load_report["ep"] == {"world": W, "rank": rank, "capacity": CAP,
                                                      "transport": "all-gather"}
                # the same shapes on both ranks, then different ones (data-parallel attention: each its own batch)
                for shapes in (((2, 12), (2, 12)), ((2, 11), (3, 5))):
                    ids = _ids(rank, shapes)
                    with torch.no_grad():
                        got, want = ep(ids).logits, single(ids).logits
                    assert torch.equal(got, want), f"{what} {shapes}: max |diff| {(got - want).abs().max()}"
        # generation: capacity 8 tokens, 2 sequences of 12: the prompt in 3 chunks of 4 positions
        path = paths[0]
        ep = from_pretrained(path, device="cpu", ep_group=group, ep_capacity=8)
        single = from_pretrained(path, device="cpu")
        ids = _ids(rank, ((2, 12), (2, 12)))
        got = generate(ep, ids, 6)
        want = generate(single, ids, 6, prefill_chunk=4)
        assert torch.equal(got.tokens, want.tokens)
        s = got.stats
        assert s["prefill_steps"] == 3 and s["ep_world"] == W and s["global_batch"] == 2 * W
        assert s["global_tokens_per_s"] > 0
        # the errors, raised on both ranks alike (none leaves a peer waiting in a collective)
        _both_raise(ValueError, "capacity = 8", lambda: ep(torch.zeros(1, 9, dtype=torch.long)))
        _both_raise(ValueError, "9 sequences .* ep_capacity = 8", lambda: generate(ep, torch.zeros(9, 2,
                                                                                                  dtype=torch.long), 2))
        _both_raise(ValueError, r"max_new_tokens \(2, 3 on ranks 0..1\) differ", lambda: generate(ep, ids, 2 + rank))
        _both_raise(ValueError, "ep_group needs ep_capacity", lambda: from_pretrained(path, device="cpu",
                                                                                      ep_group=group))
        _both_raise(ValueError, "ep_transport must be one of", lambda: from_pretrained(
            path, device="cpu", ep_group=group, ep_capacity=8, ep_transport="all-to-all"))
        _both_raise(ValueError, "needs CUDA", lambda: from_pretrained(path, device="cpu", ep_group=group,
                                                                      ep_capacity=8, ep_transport="symm-mem"))
    finally:
        dist.destroy_process_group()
    # the command as torchrun starts it: the environment names the rank; it joins and leaves the group itself
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(W), LOCAL_RANK=str(rank), MASTER_PORT=str(cli_port))
    ap = argparse.ArgumentParser()
    add_commands(ap.add_subparsers())
    args = ap.parse_args(["generate", str(paths[-1]), "--ep", "2", "--batch", "4", "--max-new-tokens", "6",
                          "--device", "cpu", "--json", "--ep-timeout", "60"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert args.fn(args) == 0
    text = out.getvalue()
    if rank == 0:
        assert "tokens: [" in text and '"ep_world": 2' in text and '"global_batch": 4' in text, text
    else:
        assert text == "", text
    assert not dist.is_initialized()


def test_ep_loaded_model_on_two_gloo_processes(tmp_path):
    paths = [make_checkpoint(tmp_path / f"{arch}-{fmt}", arch=arch, fmt=fmt, shard_bytes=50_000,
                             shared_scales=arch != "mixtral") for arch, fmt in CASES]
    run_ranks(_worker, (free_port(), free_port(), paths), W, TIMEOUT_S)


def test_ep_argument_errors(tmp_path, monkeypatch):
    path = make_checkpoint(tmp_path / "m", shard_bytes=50_000)
    with pytest.raises(ValueError, match="ep_capacity is given but ep_group is None"):
        from_pretrained(path, device="cpu", ep_capacity=8)
    with pytest.raises(RuntimeError, match="torch.distributed initialised"):
        from_pretrained(path, device="cpu", ep_group=object(), ep_capacity=8)
    ap = argparse.ArgumentParser()
    add_commands(ap.add_subparsers())
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    for argv, match in ((["--ep", "2"], "torchrun --nproc_per_node 2"), (["--ep-capacity", "4"], "needs --ep")):
        args = ap.parse_args(["generate", str(path), "--device", "cpu", *argv])
        with pytest.raises(SystemExit, match=match):
            args.fn(args)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = ap.parse_args(["generate", str(path), "--device", "cpu", "--ep", "2", "--batch", "3"])
    with pytest.raises(SystemExit, match="--batch 3 must be a multiple of --ep 2"):
        args.fn(args)
