"""Training-step throughput: our GPT (pipeline/models/gpt.py) vs transformers.GPT2LMHeadModel.

Both models get the same config, the same initial weights (ours copied into HF's), the same
batches of ``--seq`` tokens (packed blocks: no padding) and the same fused AdamW (decay groups
from ``param_groups``). A step is forward + next-token loss (ours: the fused head + loss of training, ``targets=``; HF:
``labels=input_ids``, which shifts inside) + backward + AdamW step. Each dropout setting runs
four models: ours and HF in fp32, and both under ``torch.autocast(dtype=bfloat16)``. After warmup
the timed steps rotate through the four in this one process (the order shifts every round), so
all see the same machine state on a machine other processes share; tokens/s come from the
median step time, and each ratio is the median over rounds of HF's step time / ours in the
same round.

    .venv/bin/python bench/bench_gpt.py                  # CPU, 4 layers / 256 hidden, 32 x 128, dropout 0 and 0.1
    .venv/bin/python bench/bench_gpt.py --dropout 0.1 --steps 20 --json bench/out/gpt.json
    .venv/bin/python bench/bench_gpt.py --device cuda --batch 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.interop.hf_gpt import hf_gpt2_config, to_hf_gpt2_state_dict  # noqa: E402
from pipeline.models.bert import BertConfig, num_parameters, param_groups  # noqa: E402
from pipeline.models.gpt import GPT, decoder_flops_per_token  # noqa: E402
from pipeline.pretrain.objectives.clm import CausalLM  # noqa: E402

VARIANTS = ("ours", "hf", "ours_bf16", "hf_bf16")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=None, help="default hidden / 64")
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument(
        "--dropout",
        type=float,
        nargs="+",
        default=[0.0, 0.1],
        help="dropout settings to run (hidden and attention dropout alike)",
    )
    p.add_argument("--steps", type=int, default=8, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def make_config(args, dropout: float) -> BertConfig:
    H = args.hidden
    return BertConfig(
        vocab_size=args.vocab,
        hidden_size=H,
        num_layers=args.layers,
        num_heads=args.heads or max(1, H // 64),
        intermediate_size=4 * H,
        max_position=max(args.seq, 128),
        dropout=dropout,
        attention_dropout=dropout,
        layer_norm_eps=1e-5,
        gelu="tanh",
    )


def build(args, config: BertConfig, variant: str):
    """step_fn(ids) -> loss for a variant: forward + loss + backward + AdamW step."""
    torch.manual_seed(args.seed)
    ours = GPT(config)
    if variant.startswith("hf"):
        import transformers

        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**hf_gpt2_config(config)))
        model.load_state_dict(to_hf_gpt2_state_dict(ours))
    else:
        model = ours
    model.to(args.device).train()
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4, fused=True)
    device_type = args.device.split(":")[0]
    bf16 = variant.endswith("bf16")
    objective = CausalLM()

    def step(ids):
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            if variant.startswith("ours"):  # pretrain.objective clm's own forward: fused head + loss, no logits
                loss = objective.forward(model, SimpleNamespace(input_ids=ids)).loss
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return model, step


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run(args, dropout: float) -> dict:
    config = make_config(args, dropout)
    B, T = args.batch, args.seq
    g = torch.Generator().manual_seed(args.seed)
    batches = [torch.randint(5, args.vocab, (B, T), generator=g).to(args.device) for _ in range(4)]
    steps = {v: build(args, config, v)[1] for v in args.variants}
    for step in steps.values():
        for i in range(args.warmup):
            step(batches[i % len(batches)])
    sync(args.device)
    times: dict[str, list[float]] = {v: [] for v in steps}
    losses: dict[str, float] = {}
    names = list(steps)
    for i in range(args.steps):
        for v in names[i % len(names) :] + names[: i % len(names)]:  # rotate the order every round
            sync(args.device)
            t0 = time.perf_counter()
            losses[v] = float(steps[v](batches[i % len(batches)]).detach())
            sync(args.device)
            times[v].append(time.perf_counter() - t0)
    tps = {v: B * T / statistics.median(t) for v, t in times.items()}
    ratios = {}
    for o, h in (("ours", "hf"), ("ours_bf16", "hf"), ("ours_bf16", "hf_bf16")):
        if o in times and h in times:
            ratios[f"{o}/{h}"] = statistics.median(th / to for to, th in zip(times[o], times[h]))
    return {
        "dropout": dropout,
        "tokens_per_s": tps,
        "median_step_s": {v: statistics.median(t) for v, t in times.items()},
        "last_loss": losses,
        "ratios": ratios,
        "load_average_after": os.getloadavg()[0],
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = make_config(args, 0.0)
    fpt = decoder_flops_per_token(config, args.seq)
    print(
        f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"config: {config.num_layers} layers / {config.hidden_size} hidden / {config.num_heads} heads / vocab "
        f"{config.vocab_size} ({num_parameters(GPT(config)):,} parameters, tied head); batch {args.batch} x seq "
        f"{args.seq}; {args.steps} timed steps per model, rotated; {fpt / 1e6:.1f} MFLOP per token"
    )
    results = []
    for dropout in args.dropout:
        r = run(args, dropout)
        results.append(r)
        print(f"\ndropout {dropout}:\n{'model':<10} {'tokens/s':>9} {'ms/step':>9} {'GFLOP/s':>8} {'last loss':>10}")
        for v in args.variants:
            print(
                f"{v:<10} {r['tokens_per_s'][v]:9.0f} {1000 * r['median_step_s'][v]:9.0f} "
                f"{r['tokens_per_s'][v] * fpt / 1e9:8.1f} {r['last_loss'][v]:10.4f}"
            )
        print(
            "ratios (tokens/s; median over rounds of the paired step times): "
            + ", ".join(f"{k} {x:.2f}x" for k, x in r["ratios"].items())
        )
    print(f"\nload average now {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "config": config.to_dict(),
                    "batch": args.batch,
                    "seq": args.seq,
                    "steps": args.steps,
                    "torch": torch.__version__,
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
