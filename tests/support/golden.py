"""The golden run: a tiny pre-training and fine-tuning whose weight hashes are committed
(tests/support/golden/weights.json) and checked on every run of the suite (tests/e2e/test_golden.py).

It runs in a process of its own, with params.yaml's default arithmetic (``compute.kernels:
portable``, fp32, 2 threads) pinned before torch loads, exactly as a stage does, on data it
writes itself: 30 updates of a 1-layer BERT (MLM + NSP, dropout 0.1, skip-gram embedding init)
on synthetic examples, then 6 fine-tuning updates of a classifier on the result (dropout 0.1,
AdamW). Any x86-64 CPU with AVX2 must reproduce every tensor bit for bit; a host whose arithmetic
differs fails naming the first tensor that differs.

    python tests/support/golden.py            # print the hashes as JSON
    python tests/support/golden.py --write    # rewrite tests/support/golden/weights.json (after a deliberate change)
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipeline.core.arithmetic import ComputeConfig, pin_process  # noqa: E402  (torch-free)

pin_process(ComputeConfig())  # the pins and MKL's vendor shim, before torch loads, as stages.arithmetic does

# isort: split
import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402

from pipeline.core.device import apply_arithmetic, arithmetic_state, cpu_model  # noqa: E402
from pipeline.finetune.loop import FinetuneConfig, build_model, task_loss  # noqa: E402
from pipeline.models.checkpoint import load_pretrained  # noqa: E402
from pipeline.pretrain.config import PretrainConfig  # noqa: E402
from pipeline.pretrain.loop import pretrain  # noqa: E402
from tests.support.examples_data import make_examples  # noqa: E402

GOLDEN = REPO / "tests" / "support" / "golden" / "weights.json"
MODEL = {
    "preset": "tiny",
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_position": 64,
    "dropout": 0.1,
    "attention_dropout": 0.1,
}


def tensor_sha256(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode() + t.numpy().tobytes()).hexdigest()


def golden_run(work: Path) -> dict:
    """``{"pretrain/<tensor>": sha256, ..., "finetune/<tensor>": sha256, ...}`` plus losses."""
    apply_arithmetic(ComputeConfig())
    examples = make_examples(
        work / "examples", masking="static", train_rows=512, valid_rows=64, rows_per_shard=128, row_group_size=32
    )
    cfg = PretrainConfig(
        objective="mlm_nsp",
        model=dict(MODEL),
        batch_size=16,
        lr=3e-3,
        warmup=0.1,
        max_steps=30,
        eval_every=0,
        eval_batches=None,
        log_every=10,
        checkpoint_every=None,
        checkpoint_minutes=None,
        snapshot_steps=[],
        shuffle_buffer=64,
        seed=0,
        device="cpu",
        embedding_init={"method": "skipgram", "epochs": 0.25, "batch_rows": 64},
    )
    metrics = pretrain(
        cfg,
        examples_dir=examples,
        out_dir=work / "pretrain",
        progress=False,
        provenance={"git": {"commit": "golden", "dirty": False}},
    )
    ckpt = load_pretrained(work / "pretrain" / "last.pt")
    hashes = {f"pretrain/{k}": tensor_sha256(v) for k, v in ckpt["model"].items()}

    ft = FinetuneConfig()
    threads = torch.get_num_threads()
    torch.set_num_threads(ft.threads)
    try:
        model = build_model(ckpt, 2, dropout=ft.dropout, encoder_dropout=ft.encoder_dropout, pooling=ft.pooling, seed=0)
        model.train()
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=ft.lr, betas=tuple(ft.betas), eps=ft.eps, weight_decay=ft.weight_decay
        )
        g = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(6):
            ids = torch.randint(5, 60, (16, 24), generator=g)
            ids[:, 0] = 2  # [CLS]
            labels = torch.randint(0, 2, (16,), generator=g)
            loss = task_loss(model(ids, torch.zeros_like(ids), torch.ones_like(ids)), labels)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), ft.clip_grad_norm)
            optimizer.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    hashes.update({f"finetune/{k}": tensor_sha256(v) for k, v in model.state_dict().items()})
    state = arithmetic_state(torch.device("cpu"), "fp32", threads_fixed=True)
    return {
        "torch": torch.__version__,
        "kernels": state["kernels"],
        "cpu_capability": state["cpu_capability"],
        "mkl_branch": state["mkl_branch"],
        "threads": cfg.num_threads,
        "pretrain_loss": metrics.get("loss"),
        "finetune_losses": losses,
        "tensors": hashes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {GOLDEN.relative_to(REPO)}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bertrace-golden-") as tmp:
        result = golden_run(Path(tmp))
    result["host"] = cpu_model()
    text = json.dumps(result, indent=1) + "\n"  # tensors in the order they were computed
    if args.write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text, encoding="utf-8")
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
