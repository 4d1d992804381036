"""A decoder's training step: eager PyTorch against the same model calling kernelgate's ops.

``kernelgate bench`` times one op at a time, where a step through kernelgate's ``autograd.Function`` is
bound by the host's time on the H200 (its steps issued back to back). In a model, other ops (the
matrix multiplies, attention) keep the device busy while the host issues the next op, which can hide
that host time. This measures the whole step of a small Llama-style decoder (RMSNorm, rotary
embedding, grouped-query attention through ``scaled_dot_product_attention``, a SwiGLU MLP, a
cross-entropy loss over the vocabulary) two ways, with the same weights and batch:

- ``torch``: ``F.rms_norm``, ``silu(gate) * up``, ``F.cross_entropy``, and kernelgate's rotary
  reference (plain PyTorch; torch has no rotary op);
- ``kernelgate``: ``kg.rms_norm``, ``kg.rotary_embedding``, ``kg.swiglu``, ``kg.cross_entropy``
  (mode ``auto`` unless ``--mode`` says otherwise: each op's path and step route decided as a user's
  would be).

With ``--norm layer_norm`` the norms are LayerNorms with a weight and a bias (``F.layer_norm`` against
``kg.layer_norm``) instead of RMSNorms.

A step is ``zero_grad``, the forward and ``loss.backward()``. After warm-up steps (tuning, the step
routes' timing), ``--steps`` steps are issued back to back, then one synchronise, in ``--rounds``
interleaved rounds; the host's time to issue them is reported beside the total. The two variants'
losses and gradient norms must agree (bfloat16 tolerance), else the script fails. Writes JSON with
provenance.

    python benchmarks/model_step.py --out model-step.json
    python benchmarks/model_step.py --device cpu --tiny --steps 2 --rounds 1 --out /tmp/m.json  # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from provenance import provenance, write_json  # benchmarks/provenance.py, beside this script

import kernelgate as kg
from kernelgate.ops.rotary.reference import rotary_embedding_reference


@dataclass(frozen=True)
class Config:
    """The decoder's sizes."""

    dim: int = 2048
    layers: int = 8
    heads: int = 16
    kv_heads: int = 4
    hidden: int = 5632
    vocab: int = 32000
    batch: int = 4
    seq: int = 2048
    eps: float = 1e-6


TINY = Config(dim=64, layers=2, heads=4, kv_heads=2, hidden=96, vocab=128, batch=2, seq=16)


# A norm's call: (x, weight, bias or None, eps).
Norm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, float], torch.Tensor]


@dataclass(frozen=True)
class Ops:
    """The four ops a variant calls."""

    norm: Norm
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    swiglu: Callable[[torch.Tensor], torch.Tensor]
    cross_entropy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _torch_swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# Each variant's norms, by --norm.
NORMS: dict[str, dict[str, Norm]] = {
    "rms_norm": {
        "torch": lambda x, w, b, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
        "kernelgate": lambda x, w, b, eps: kg.rms_norm(x, w, eps),
    },
    "layer_norm": {
        "torch": lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
        "kernelgate": lambda x, w, b, eps: kg.layer_norm(x, (x.shape[-1],), w, b, eps),
    },
}


def variants(norm: str) -> dict[str, Ops]:
    """The two variants, with ``norm``'s norms (a key of :data:`NORMS`)."""
    return {
        "torch": Ops(
            norm=NORMS[norm]["torch"],
            rotary=rotary_embedding_reference,
            swiglu=_torch_swiglu,
            cross_entropy=F.cross_entropy,
        ),
        "kernelgate": Ops(
            norm=NORMS[norm]["kernelgate"],
            rotary=kg.rotary_embedding,
            swiglu=lambda gate_up: kg.swiglu(gate_up),
            cross_entropy=kg.cross_entropy,
        ),
    }


VARIANTS = variants("rms_norm")


def _norm_bias(cfg: Config, bias: bool) -> torch.nn.Parameter | None:
    return torch.nn.Parameter(torch.zeros(cfg.dim)) if bias else None


class Block(torch.nn.Module):
    def __init__(self, cfg: Config, bias: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        head_dim = cfg.dim // cfg.heads
        self.attn_norm = torch.nn.Parameter(torch.ones(cfg.dim))
        self.attn_norm_bias = _norm_bias(cfg, bias)
        self.qkv = torch.nn.Linear(cfg.dim, (cfg.heads + 2 * cfg.kv_heads) * head_dim, bias=False)
        self.out = torch.nn.Linear(cfg.heads * head_dim, cfg.dim, bias=False)
        self.mlp_norm = torch.nn.Parameter(torch.ones(cfg.dim))
        self.mlp_norm_bias = _norm_bias(cfg, bias)
        self.gate_up = torch.nn.Linear(cfg.dim, 2 * cfg.hidden, bias=False)
        self.down = torch.nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: Ops) -> torch.Tensor:
        cfg = self.cfg
        batch, seq, _ = x.shape
        head_dim = cfg.dim // cfg.heads
        h = ops.norm(x, self.attn_norm, self.attn_norm_bias, cfg.eps)
        qkv = self.qkv(h).view(batch, seq, cfg.heads + 2 * cfg.kv_heads, head_dim)
        q, k, v = qkv.split((cfg.heads, cfg.kv_heads, cfg.kv_heads), dim=2)
        q, k = ops.rotary(q, k, cos, sin)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        x = x + self.out(attn.transpose(1, 2).reshape(batch, seq, cfg.heads * head_dim))
        h = ops.norm(x, self.mlp_norm, self.mlp_norm_bias, cfg.eps)
        return x + self.down(ops.swiglu(self.gate_up(h)))


class Decoder(torch.nn.Module):
    def __init__(self, cfg: Config, bias: bool = False) -> None:
        """``bias``: the norms have a bias (LayerNorm) as well as a weight."""
        super().__init__()
        self.cfg = cfg
        self.embed = torch.nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = torch.nn.ModuleList(Block(cfg, bias) for _ in range(cfg.layers))
        self.norm = torch.nn.Parameter(torch.ones(cfg.dim))
        self.norm_bias = _norm_bias(cfg, bias)
        self.head = torch.nn.Linear(cfg.dim, cfg.vocab, bias=False)
        half = cfg.dim // cfg.heads // 2
        angles = torch.outer(torch.arange(cfg.seq, dtype=torch.float32), 10000.0 ** (-torch.arange(half) / half))
        # Plain attributes, not buffers: Module.to(dtype) would round the angles to the model's dtype.
        self.cos, self.sin = angles.cos(), angles.sin()

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, ops: Ops) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin, ops)
        logits = self.head(ops.norm(x, self.norm, self.norm_bias, self.cfg.eps))
        return ops.cross_entropy(logits.view(-1, self.cfg.vocab), targets.view(-1))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _steps(model: Decoder, batch: tuple[torch.Tensor, torch.Tensor], ops: Ops, n: int) -> tuple[float, float]:
    """``n`` steps back to back, then one synchronise: (host ms to issue a step, ms a step)."""
    device = batch[0].device
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(n):
        model.zero_grad(set_to_none=True)
        model.loss(*batch, ops).backward()
    issued = time.perf_counter()
    _synchronize(device)
    end = time.perf_counter()
    return (issued - start) / n * 1e3, (end - start) / n * 1e3


def _step_routes(model: Decoder, batch: tuple[torch.Tensor, torch.Tensor], norm: str) -> dict[str, str]:
    """How kernelgate's autograd calls ran in the timed steps, per op and input shape: through its Function or eager
    autograd of the reference, and why (``Op.step_route``), read from the calls of one more step."""
    calls: dict[str, tuple[kg.Op, tuple[Any, ...]]] = {}

    def recorded(op: kg.Op) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            shapes = "/".join("x".join(map(str, a.shape)) for a in args if isinstance(a, torch.Tensor))
            calls.setdefault(f"{op.name} {shapes}", (op, args))
            return op(*args)

        return call

    norm_op = recorded(getattr(kg, norm))
    ops = Ops(
        norm=(
            (lambda x, w, b, eps: norm_op(x, (x.shape[-1],), w, b, eps))
            if norm == "layer_norm"
            else (lambda x, w, b, eps: norm_op(x, w, eps))
        ),
        rotary=recorded(kg.rotary_embedding),
        swiglu=recorded(kg.swiglu),
        cross_entropy=recorded(kg.cross_entropy),
    )
    model.zero_grad(set_to_none=True)
    model.loss(*batch, ops).backward()
    routes = {}
    for key, (op, args) in calls.items():
        route = op.step_route(*args)
        routes[key] = f"{route.path}: {route.detail}"
    return routes


def _grad_norm(model: Decoder) -> float:
    norms = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--tiny", action="store_true", help="a two-layer model of width 64 (a smoke run)")
    parser.add_argument(
        "--norm", default="rms_norm", choices=sorted(NORMS), help="the model's norms (default rms_norm, as Llama's)"
    )
    parser.add_argument("--layers", type=int, help="override the number of layers")
    parser.add_argument("--seq", type=int, help="override the sequence length")
    parser.add_argument("--steps", type=int, default=20, help="steps a round (default 20)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=5, help="steps of each variant before timing (default 5)")
    parser.add_argument(
        "--mode",
        default="auto",
        choices=["auto", "triton", "reference"],
        help="kernelgate's mode for its variant (default auto: each op's path and step route as a user's)",
    )
    parser.add_argument(
        "--no-autograd-threads",
        action="store_true",
        help="run backwards on the calling thread (torch.autograd.set_multithreading_enabled(False))",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/model_step.py: no CUDA device is visible here; pass --device cpu for a smoke run.",
            file=sys.stderr,
        )
        return 2
    cfg = TINY if args.tiny else Config()
    if args.layers or args.seq:
        cfg = Config(
            **{
                **asdict(cfg),
                **({"layers": args.layers} if args.layers else {}),
                **({"seq": args.seq} if args.seq else {}),
            }
        )
    dtype = getattr(torch, args.dtype)
    kg.configure(mode=args.mode)
    torch.autograd.set_multithreading_enabled(not args.no_autograd_threads)
    torch.manual_seed(0)
    model = Decoder(cfg, bias=args.norm == "layer_norm").to(device=device, dtype=dtype)
    # VARIANTS is rms_norm's (a test replaces an op in it).
    chosen = VARIANTS if args.norm == "rms_norm" else variants(args.norm)
    model.cos, model.sin = model.cos.to(device), model.sin.to(device)  # float32 angles
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(cfg.vocab, (cfg.batch, cfg.seq), generator=generator).to(device)
    targets = torch.randint(cfg.vocab, (cfg.batch, cfg.seq), generator=generator).to(device)
    batch = (tokens, targets)

    checks: dict[str, dict[str, float]] = {}
    for name, ops in chosen.items():
        for _ in range(args.warmup):  # tuning, the step routes' timing, allocator warm-up
            model.zero_grad(set_to_none=True)
            loss = model.loss(*batch, ops)
            loss.backward()
        checks[name] = {"loss": float(loss.detach()), "grad_norm": _grad_norm(model)}
    reference, ours = checks["torch"], checks["kernelgate"]
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    agree = all(abs(ours[k] - reference[k]) <= tolerance * abs(reference[k]) for k in reference)

    times: dict[str, list[tuple[float, float]]] = {name: [] for name in chosen}
    for _ in range(args.rounds):
        for name, ops in chosen.items():
            times[name].append(_steps(model, batch, ops, args.steps))
    summary: dict[str, Any] = {}
    for name, rounds in times.items():
        totals = [t for _, t in rounds]
        summary[name] = {
            "ms_per_step_best": round(min(totals), 3),
            "ms_per_step_median": round(statistics.median(totals), 3),
            "host_ms_to_issue_median": round(statistics.median(i for i, _ in rounds), 3),
            "rounds": [[round(i, 3), round(t, 3)] for i, t in rounds],
            "tokens_per_s_median": round(cfg.batch * cfg.seq / statistics.median(totals) * 1e3, 1),
        }
    routes = _step_routes(model, batch, args.norm)
    ratio = summary["torch"]["ms_per_step_median"] / summary["kernelgate"]["ms_per_step_median"]
    result = {
        "benchmark": "a decoder's training step (zero_grad, forward, backward): eager torch against kernelgate's ops",
        "method": f"{args.warmup} warm-up steps a variant; {args.rounds} interleaved rounds of {args.steps} steps back "
        "to back, then one synchronise",
        **provenance(device),
        "config": asdict(cfg),
        "dtype": args.dtype,
        "autograd_threads": not args.no_autograd_threads,
        "kernelgate_mode": args.mode,
        "norm": args.norm,
        "checks": checks,
        "checks_agree": agree,
        "variants": summary,
        "speedup_median": round(ratio, 3),
        "step_routes": routes,
    }
    write_json(args.out, result)
    for name, row in summary.items():
        print(
            f"{name:10} {row['ms_per_step_median']:9.3f} ms a step (best {row['ms_per_step_best']:.3f}, host "
            f"{row['host_ms_to_issue_median']:.3f} to issue), loss {checks[name]['loss']:.4f}"
        )
    print(f"kernelgate's step is {ratio:.3f}x torch's (median of rounds)")
    if not agree:
        print(f"the variants disagree beyond {tolerance}: {checks}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
