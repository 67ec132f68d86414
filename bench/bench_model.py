"""Training-step throughput: our BertForPreTraining vs transformers.BertForPreTraining.

Both models get the same config, the same initial weights (ours copied into HF's), the same
batches and the same AdamW (decay groups from ``param_groups``). Ours receives the masked
positions as flat indices (Google's gather_indexes); HF receives labels of -100 everywhere but
the masked positions, as ``DataCollatorForLanguageModeling`` produces. After warmup the timed
steps alternate between the two models in this one process (the order flips every step), so
both see the same machine state; tokens/s come from the median step time, robust to the odd
step another process slows down. Peak memory: on CUDA ``max_memory_allocated`` during the
timed steps; on CPU the peak RSS (VmHWM) of a separate process that trains only that model,
above its RSS after imports.

    .venv/bin/python bench/bench_model.py                       # CPU, 4 layers / 256 hidden, 32 x 128
    .venv/bin/python bench/bench_model.py --device cuda --dtype bf16 --compile --batch 256

``--variants`` times several set-ups against each other in one process, the steps rotating
among them (the first is the reference of the ratios): ``hf`` (transformers.BertForPreTraining,
MLM + NSP), ``ours`` (BertForPreTraining, MLM + NSP), ``mlm`` (ours, MLM only as
``pretrain.objective: mlm``), ``electra`` (pipeline/pretrain/objectives/electra.py: generator at 1/4
width, sampling, discriminator on every position), each with ``-bf16`` (CPU/CUDA autocast) and/or
``-compile`` suffixes:

    .venv/bin/python bench/bench_model.py --variants hf,ours,ours-bf16,ours-bf16-compile,mlm-bf16,electra-bf16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.device import build_adamw, peak_flops  # noqa: E402
from pipeline.core.formats import MASK_ID  # noqa: E402
from pipeline.interop.hf import hf_config, to_hf_state_dict  # noqa: E402
from pipeline.models.bert import (  # noqa: E402
    BertConfig,
    BertForPreTraining,
    flops_per_token,
    num_parameters,
    param_groups,
    pretraining_loss,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=None, help="default hidden / 64")
    p.add_argument("--intermediate", type=int, default=None, help="default 4 * hidden")
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--gelu", choices=["tanh", "exact"], default="tanh")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--masked", type=int, default=20, help="masked positions per sequence")
    p.add_argument("--steps", type=int, default=20, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model first")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16 = autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile both models")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="accelerator peak for MFU (default: pipeline.core.device.PEAK_FLOPS for this GPU and --dtype)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the CPU peak-RSS probes")
    p.add_argument(
        "--variants",
        default=None,
        help="comma-separated set-ups to time against the first, e.g. hf,ours,ours-bf16,electra-bf16 "
        "(see the module docstring); --dtype/--compile are then ignored",
    )
    p.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout (BERT: 0.1)")
    p.add_argument("--json", default=None, help="--variants: also write the results to this JSON file")
    p.add_argument("--only", choices=["ours", "hf"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def make_config(args) -> BertConfig:
    return BertConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads or max(1, args.hidden // 64),
        intermediate_size=args.intermediate or 4 * args.hidden,
        gelu=args.gelu,
        dropout=args.dropout,
        attention_dropout=args.dropout,
    )


def make_batches(args, n: int = 4) -> list[dict]:
    """Random ids, [CLS] A [SEP] B [SEP] segments, ``masked`` distinct positions per row."""
    g = torch.Generator().manual_seed(args.seed)
    B, T, M = args.batch, args.seq, args.masked
    batches = []
    for _ in range(n):
        ids = torch.randint(5, args.vocab, (B, T), generator=g)
        ids[:, 0], ids[:, T // 2], ids[:, -1] = 2, 3, 3
        token_type = torch.zeros(B, T, dtype=torch.long)
        token_type[:, T // 2 + 1 :] = 1
        # positions 1..T-2 minus the middle [SEP]; pick M per row without replacement
        candidates = torch.tensor([t for t in range(1, T - 1) if t != T // 2])
        order = torch.rand(B, len(candidates), generator=g).argsort(dim=1)[:, :M]
        pos = candidates[order].sort(dim=1).values  # [B, M]
        rows = torch.arange(B)[:, None].expand(B, M)
        labels = ids[rows, pos].clone()
        ids[rows, pos] = MASK_ID
        hf_labels = torch.full((B, T), -100, dtype=torch.long)
        hf_labels[rows, pos] = labels
        batches.append(
            {
                "input_ids": ids,
                "token_type_ids": token_type,
                "attention_mask": torch.ones(B, T, dtype=torch.long),
                "masked_positions": (rows * T + pos).reshape(-1),
                "mlm_labels": labels.reshape(-1),
                "hf_labels": hf_labels,
                "nsp_labels": torch.randint(0, 2, (B,), generator=g),
            }
        )
    return [{k: v.to(args.device) for k, v in b.items()} for b in batches]


def build(args, which: str):
    """(model, step_fn) for "ours" or "hf", identical initial weights; step_fn(batch) runs
    forward + backward + AdamW step and returns the loss."""
    torch.manual_seed(args.seed)
    config = make_config(args)
    ours = BertForPreTraining(config)
    if which == "hf":
        import transformers

        model = transformers.BertForPreTraining(transformers.BertConfig(**hf_config(config)))
        model.load_state_dict(to_hf_state_dict(ours))
    else:
        model = ours
    model.to(args.device).train()
    opt = build_adamw(param_groups(model, 0.01), torch.device(args.device), lr=1e-4, betas=(0.9, 0.999), eps=1e-8)
    fwd = torch.compile(model) if args.compile else model
    device_type = args.device.split(":")[0]

    def step(b):
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            if which == "ours":
                out = fwd(
                    b["input_ids"],
                    b["token_type_ids"],
                    b["attention_mask"],
                    b["masked_positions"],
                    mlm_labels=b["mlm_labels"],
                )  # as training: the MLM loss fused with the decoder
                loss = pretraining_loss(out, b["mlm_labels"], b["nsp_labels"])[0]
            else:
                loss = fwd(
                    input_ids=b["input_ids"],
                    token_type_ids=b["token_type_ids"],
                    attention_mask=b["attention_mask"],
                    labels=b["hf_labels"],
                    next_sentence_label=b["nsp_labels"],
                ).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return model, step


def build_variant(args, name: str):
    """(model, step_fn) for a ``--variants`` entry: hf | ours | mlm | electra, then -bf16 / -compile."""
    kind, *flags = name.split("-")
    unknown = set(flags) - {"bf16", "compile"}
    if kind not in ("hf", "ours", "mlm", "electra") or unknown:
        raise SystemExit(f"--variants: {name!r} is not <hf|ours|mlm|electra>[-bf16][-compile]")
    bf16, compiled = "bf16" in flags, "compile" in flags
    torch.manual_seed(args.seed)
    config = make_config(args)
    device_type = args.device.split(":")[0]
    if kind == "electra":
        from pipeline.models.electra import ElectraForPreTraining, generator_config, uniform_noise
        from pipeline.pretrain.objectives.electra import electra_losses

        model = ElectraForPreTraining(config, generator_config(config))
    else:
        model = BertForPreTraining(config)
    if kind == "hf":
        import transformers

        hf = transformers.BertForPreTraining(transformers.BertConfig(**hf_config(config)))
        hf.load_state_dict(to_hf_state_dict(model))
        model = hf
    model.to(args.device).train()
    # the AdamW the training loops build (fused on the CPU too), for both models alike
    opt = build_adamw(param_groups(model, 0.01), torch.device(args.device), lr=1e-4, betas=(0.9, 0.999), eps=1e-8)
    fwd = torch.compile(model, dynamic=True) if compiled else model

    def step(b):
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            if kind == "hf":
                loss = fwd(
                    input_ids=b["input_ids"],
                    token_type_ids=b["token_type_ids"],
                    attention_mask=b["attention_mask"],
                    labels=b["hf_labels"],
                    next_sentence_label=b["nsp_labels"],
                ).loss
            elif kind == "electra":
                noise = uniform_noise(b["masked_positions"].numel(), args.device)
                out = fwd(
                    b["input_ids"],
                    b["token_type_ids"],
                    b["attention_mask"],
                    b["masked_positions"],
                    b["mlm_labels"],
                    noise,
                    padded=False,
                )
                loss = electra_losses(out, b["mlm_labels"], b["attention_mask"])["loss"]
            else:
                out = fwd(
                    b["input_ids"],
                    b["token_type_ids"],
                    b["attention_mask"],
                    b["masked_positions"],
                    padded=False,
                    mlm_labels=b["mlm_labels"],
                )  # as training: the MLM loss fused with the decoder
                loss = pretraining_loss(out, b["mlm_labels"], b["nsp_labels"], 0.0 if kind == "mlm" else 1.0)[0]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return model, step


def run_variants(args) -> dict:
    """Time ``args.variants`` against each other (rotating order), print and return the table."""
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    B, T = args.batch, args.seq
    config = make_config(args)
    print(
        f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, cpu capability "
        f"{torch.backends.cpu.get_cpu_capability()}, load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"config: {config.num_layers} layers / {config.hidden_size} hidden / vocab {config.vocab_size}, dropout "
        f"{args.dropout}; batch {B} x seq {T}, {args.masked} masked per sequence; {args.steps} timed steps each"
    )
    batches = make_batches(args)
    steps = {}
    for name in names:
        t0 = time.perf_counter()
        _, step = build_variant(args, name)
        for i in range(args.warmup):
            step(batches[i % len(batches)])
        sync(args.device)
        steps[name] = step
        print(f"  {name}: built and warmed up in {time.perf_counter() - t0:.1f} s", flush=True)
    times = {n: [] for n in names}
    for i in range(args.steps):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            sync(args.device)
            t0 = time.perf_counter()
            steps[name](batches[i % len(batches)])
            sync(args.device)
            times[name].append(time.perf_counter() - t0)
    ref = names[0]
    rows = {}
    print(f"\n{'variant':<22} {'tokens/s':>10} {'ms/step':>9} {'vs ' + ref:>12}")
    for name in names:
        ratio = statistics.median(r / t for r, t in zip(times[ref], times[name]))  # paired: same round
        rows[name] = {
            "tokens_per_s": B * T / statistics.median(times[name]),
            "ms_per_step": 1000 * statistics.median(times[name]),
            f"ratio_vs_{ref}": ratio,
        }
        print(f"{name:<22} {rows[name]['tokens_per_s']:10.0f} {rows[name]['ms_per_step']:9.1f} {ratio:11.2f}x")
    print(
        f"(ratios: median over {args.steps} rounds of this round's {ref} step time / the variant's; "
        f"load average now {os.getloadavg()[0]:.2f})"
    )
    result = {
        "config": config.to_dict(),
        "batch": B,
        "seq": T,
        "masked": args.masked,
        "steps": args.steps,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "variants": rows,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _proc_status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def probe_memory(args) -> None:
    """Child process: train one model for warmup + 2 steps, print its peak RSS above the
    baseline after imports (VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over
    from the forking parent)."""
    import transformers  # noqa: F401  (same baseline for both models)

    baseline = _proc_status_mb("VmRSS")
    _, step = build(args, args.only)
    batches = make_batches(args)
    for i in range(args.warmup + 2):
        step(batches[i % len(batches)])
    print(json.dumps({"peak_rss_mb": _proc_status_mb("VmHWM") - baseline}))


def peak_rss_mb(which: str) -> float | None:
    argv = [a for a in sys.argv[1:]] + ["--only", which]
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], capture_output=True, text=True)
    if res.returncode != 0:
        print(f"memory probe for {which} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(res.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.only:
        probe_memory(args)
        return
    if args.variants:
        run_variants(args)
        return
    cuda = args.device.startswith("cuda")
    config = make_config(args)
    B, T = args.batch, args.seq
    print(
        f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, "
        f"dtype {args.dtype}, compile {args.compile}, load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"config: {config.num_layers} layers / {config.hidden_size} hidden / {config.num_heads} heads / "
        f"vocab {config.vocab_size}; batch {B} x seq {T}, {args.masked} masked per sequence"
    )

    models = {name: build(args, name) for name in ("ours", "hf")}
    hf_model = models["hf"][0]
    print(
        f"parameters: ours {num_parameters(models['ours'][0]):,}, "
        f"hf {sum(p.numel() for p in hf_model.parameters()):,} (attention: {hf_model.config._attn_implementation})"
    )
    batches = make_batches(args)

    for _, step in models.values():
        for i in range(args.warmup):
            step(batches[i % len(batches)])
    sync(args.device)

    times = {"ours": [], "hf": []}
    peak_mem = {"ours": 0, "hf": 0}
    losses = {}
    for i in range(args.steps):
        order = ("ours", "hf") if i % 2 == 0 else ("hf", "ours")
        for name in order:
            step = models[name][1]
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            sync(args.device)
            t0 = time.perf_counter()
            losses[name] = float(step(batches[i % len(batches)]).detach())
            sync(args.device)
            times[name].append(time.perf_counter() - t0)
            if cuda:
                peak_mem[name] = max(peak_mem[name], torch.cuda.max_memory_allocated())

    # Median step time: robust to the odd step slowed down by another process on a shared
    # machine; the ratio of each alternated pair of steps is more robust still.
    tps = {k: B * T / statistics.median(v) for k, v in times.items()}
    best = {k: B * T / min(v) for k, v in times.items()}
    pair_ratio = statistics.median(h / o for o, h in zip(times["ours"], times["hf"]))
    if not cuda and not args.no_memory:
        mem = {k: peak_rss_mb(k) for k in ("ours", "hf")}
        mem_label = "peak RSS of a process training only that model, above its RSS after imports"
    elif cuda:
        mem = {k: peak_mem[k] / 2**20 for k in peak_mem}
        mem_label = "torch.cuda.max_memory_allocated during a step"
    else:
        mem, mem_label = {k: None for k in peak_mem}, "not measured (--no-memory)"
    known = peak_flops(torch.device(args.device), args.dtype)
    peak_tflops = args.peak_tflops or (known / 1e12 if known else None)
    # FLOPs actually computed: ours runs the last layer's FFN and the MLM head on the masked
    # rows, HF on every position.
    fpt = {
        "ours": flops_per_token(config, T, mlm_fraction=args.masked / T),
        "hf": flops_per_token(config, T, mlm_fraction=1.0),
    }
    print(
        f"\n{'model':<6} {'tokens/s':>10} {'best tok/s':>11} {'ms/step':>9} {'last loss':>10} "
        f"{'GFLOP/s':>9} {'peak MB':>9}" + (f" {'MFU':>6}" if cuda and peak_tflops else "")
    )
    for name in ("ours", "hf"):
        gflops = tps[name] * fpt[name] / 1e9
        mem_s = f"{mem[name]:9.0f}" if mem[name] is not None else f"{'-':>9}"
        line = (
            f"{name:<6} {tps[name]:10.0f} {best[name]:11.0f} {1000 * statistics.median(times[name]):9.1f} "
            f"{losses[name]:10.4f} {gflops:9.1f} {mem_s}"
        )
        if cuda and peak_tflops:
            line += f" {gflops / (peak_tflops * 1e3):6.1%}"
        print(line)
    print(
        f"\nratio ours/hf tokens/s: {pair_ratio:.2f}x (median over {args.steps} alternated pairs of steps; "
        f"from median steps {tps['ours'] / tps['hf']:.2f}x, from best steps {best['ours'] / best['hf']:.2f}x)"
    )
    print(f"peak memory: {mem_label}; load average now {os.getloadavg()[0]:.2f}")
    print(
        f"GFLOP/s counts the matmul FLOPs each model performs (flops_per_token; HF's MLM head "
        f"runs on all {T} positions, ours on {args.masked})"
        + (
            f"; MFU against {peak_tflops:g} TFLOP/s"
            if cuda and peak_tflops
            else "; MFU: unknown GPU, pass --peak-tflops"
            if cuda
            else ""
        )
    )


if __name__ == "__main__":
    main()
