"""The fp32 training step in the default's arithmetic against transformers.BertForPreTraining, and
as a share of this host's fp32 matmul peak (issue targets: >= 7x at 2/128 and >= 4x at 4/256,
dropout 0.1; BENCHMARKS.md).

Runs under params.yaml's default ``compute.kernels: portable`` (the pins of pipeline/core/arithmetic.py,
set before torch loads, oneDNN off), 2 threads, so both models compute as a stage would. Per
config: our BertForPreTraining (masked positions gathered, the MLM loss fused with the decoder)
and HF's, the same weights, batches and AdamW, steps interleaved in one process
(bench/bench_model.py's ``--variants`` timing, median of paired ratios). The peak is a 2048^3
sgemm timed in the same process; a step's FLOP/s is ``pipeline.models.bert.flops_per_token`` (forward +
backward matmuls of the work our model does) times tokens/s.

    .venv/bin/python bench/bench_fp32_step.py [--steps 12] [--json bench/out/fp32-step.json]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

from pipeline.core.arithmetic import ComputeConfig, pin_process  # noqa: E402  (torch-free)

pin_process(ComputeConfig())  # the pins and MKL's vendor shim, before torch loads, as stages/arithmetic.py does

# isort: split
import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import bench_model  # noqa: E402
import measure  # noqa: E402
import torch  # noqa: E402

from pipeline.core.device import apply_arithmetic  # noqa: E402
from pipeline.models.bert import flops_per_token  # noqa: E402

CONFIGS = [("2/128", 2, 128, 7.0), ("4/256", 4, 256, 4.0)]  # name, layers, hidden, target ratio vs HF


def sgemm_peak(n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n x n x n fp32 matmul on this process's threads (median of ``repeats``)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12, help="timed rounds per config")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    apply_arithmetic(ComputeConfig())
    print(
        f"{measure.machine()}; torch {torch.__version__}, {args.threads} threads, "
        f"capability {torch.backends.cpu.get_cpu_capability()}, MKL_CBWR={os.environ.get('MKL_CBWR')}"
    )
    peak = sgemm_peak()
    print(f"fp32 sgemm peak (2048^3): {peak / 1e9:.1f} GFLOP/s\n")
    results = {"machine": measure.machine(), "sgemm_peak_flops": peak, "configs": {}}
    for name, layers, hidden, target in CONFIGS:
        bargs = bench_model.parse_args(
            [
                "--layers",
                str(layers),
                "--hidden",
                str(hidden),
                "--dropout",
                "0.1",
                "--steps",
                str(args.steps),
                "--variants",
                "hf,ours",
                "--no-memory",
            ]
        )
        table = bench_model.run_variants(bargs)["variants"]
        config = bench_model.make_config(bargs)
        flops = flops_per_token(config, bargs.seq, mlm_fraction=bargs.masked / bargs.seq)
        ours = table["ours"]
        ratio, share = ours["ratio_vs_hf"], flops * ours["tokens_per_s"] / peak
        results["configs"][name] = {
            "ratio_vs_hf": ratio,
            "target": target,
            "ms_per_step": ours["ms_per_step"],
            "hf_ms_per_step": table["hf"]["ms_per_step"],
            "flops_per_s": flops * ours["tokens_per_s"],
            "share_of_sgemm_peak": share,
        }
        print(
            f"{name}: ours {ratio:.2f}x hf (target >= {target:.0f}x: {'met' if ratio >= target else 'missed'}), "
            f"{flops * ours['tokens_per_s'] / 1e9:.1f} GFLOP/s = {share:.1%} of the sgemm peak\n"
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
