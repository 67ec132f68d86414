"""GPU readiness check: what the first CUDA user runs, one PASS/FAIL line per check.

    bench/gpu_check.sh                        # everything (~12 min on one GPU with --minutes 2)
    bench/gpu_check.sh --only bf16,fp16,resume,exact --minutes 2    # in two calls of < 10 min
    bench/gpu_check.sh --only compile,ddp,finetune --minutes 2
    bench/gpu_check.sh --cpu                  # smoke mode: the same checks, tiny, on the CPU (~20 s)

Checks (synthetic data, so it needs nothing but this repository; ``--examples DIR`` uses real shards):

* ``bf16`` / ``fp16``: the gpu profile's model (BERT-base, vocabulary padded to 15,808) and batch 256
  for ``--minutes`` of wall clock, precision bf16 / fp16 (GradScaler): tokens/s and MFU;
* ``resume``: a checkpoint written on the CPU (unfused AdamW, fp32) continued on the GPU in fp16
  with fused AdamW and a GradScaler (item 1: used to raise on the first step);
* ``exact``: with ``deterministic: true`` an interrupted run resumed equals an uninterrupted one
  bit for bit (docs/scaling.md's claim on CUDA), and with ``deterministic: false`` whether it drifts;
* ``compile``: ``compile: true`` with a time budget: the clock starts after compilation (item 4),
  reports the compile time, tokens/s and MFU;
* ``ddp``: ``torchrun --nproc_per_node 2 -m stages.pretrain`` with ``device: cuda:0`` (two GPUs:
  each rank on its own, item 3; one GPU: both share it over gloo), then a resume with a larger
  budget through rank 0's broadcast (item 2);
* ``finetune``: fine-tuning + evaluation under autocast (item 10) on a learnable synthetic task:
  examples/s and accuracy.

Prints a table and writes the results as JSON (``--out``, default ``$OUT/gpu_check.json`` when
``$OUT`` is set, else ``gpu_check.json``). Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from pipeline.core.formats import SCHEMA_VERSION  # noqa: E402

CHECKS = ("bf16", "fp16", "resume", "exact", "compile", "ddp", "finetune")
TINY = {"preset": "tiny", "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "max_position": 64}


# ----------------------------------------------------------------------------- synthetic data


def synth_examples(
    out: Path,
    *,
    rows: int,
    valid_rows: int,
    vocab: int,
    seq_len: int,
    seed: int = 0,
    rows_per_shard: int = 4096,
    row_group_size: int = 512,
) -> Path:
    """Statically masked examples shards + manifest (the examples stage's format): random token
    ids, 90 % of rows at full length as Google's recipe gives, 15 % of positions masked (at most
    ``seq_len * 0.15 + 1``)."""
    rng = np.random.default_rng(seed)
    max_pred = int(seq_len * 0.15) + 1
    schema = pa.schema(
        [
            pa.field("input_ids", pa.list_(pa.uint16())),
            pa.field("token_type_ids", pa.list_(pa.uint8())),
            pa.field("next_sentence_label", pa.int8()),
            pa.field("masked_lm_positions", pa.list_(pa.uint16())),
            pa.field("masked_lm_ids", pa.list_(pa.uint16())),
        ]
    )
    splits = {}
    for split, total in (("train", rows), ("valid", valid_rows)):
        shards, done, index = [], 0, 0
        while done < total:
            n = min(rows_per_shard, total - done)
            cols = {name: [] for name in schema.names}
            tokens = masked = 0
            for _ in range(n):
                length = seq_len if rng.random() < 0.9 else int(rng.integers(16, seq_len))
                la = int(rng.integers(1, length - 3))
                ids = rng.integers(5, vocab, length).astype(np.uint16)
                ids[0], ids[la + 1], ids[-1] = 2, 3, 3  # [CLS] A [SEP] B [SEP]
                types = np.zeros(length, np.uint8)
                types[la + 2 :] = 1
                candidates = np.setdiff1d(np.arange(1, length - 1), [la + 1])
                k = min(max_pred, max(1, int(round(length * 0.15))))
                pos = np.sort(rng.choice(candidates, k, replace=False)).astype(np.uint16)
                labels = ids[pos].copy()
                ids[pos] = 4  # [MASK]
                for name, value in zip(schema.names, (ids, types, int(rng.random() < 0.5), pos, labels)):
                    cols[name].append(value)
                tokens, masked = tokens + length, masked + k
            rel = f"{split}/shard-{index:05d}.parquet"
            (out / split).mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table(cols, schema=schema), out / rel, row_group_size=row_group_size)
            sha = hashlib.sha256((out / rel).read_bytes()).hexdigest()
            shards.append({"path": rel, "rows": n, "tokens": tokens, "masked": masked, "sha256": sha})
            done, index = done + n, index + 1
        tok = sum(s["tokens"] for s in shards)
        splits[split] = {
            "rows": total,
            "tokens": tok,
            "documents": total,
            "shards": shards,
            "masked_fraction": sum(s["masked"] for s in shards) / tok,
        }
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "masking": "static",
        "tokenizer_sha256": "0" * 64,
        "vocab_size": vocab,
        "special_ids": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4},
        "max_seq_len": seq_len,
        "masked_lm_prob": 0.15,
        "max_predictions_per_seq": max_pred,
        "whole_word_masking": False,
        "seed": seed,
        "params": {"masking": "static"},
        "inputs": {},
        "splits": splits,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return out


def synth_task(out: Path, n_train: int, n_valid: int) -> tuple[dict, Path]:
    """A learnable classification task (label 1 iff the sentence says "good") and a WordPiece
    tokenizer trained on it."""
    from tokenizers import trainers

    from pipeline.core.formats import SPECIAL_TOKENS
    from pipeline.data.tokenizer import build_tokenizer

    words = "the a movie film story plot actor scene was is very quite rather this that".split()
    rng = random.Random(0)

    def rows(n):
        out_rows = []
        for i in range(n):
            w = rng.choices(words, k=rng.randint(4, 10))
            w.insert(rng.randrange(len(w) + 1), "good" if i % 2 else "bad")
            out_rows.append((" ".join(w), i % 2))
        return out_rows

    train, valid = rows(n_train), rows(n_valid)
    tok = build_tokenizer(lowercase=True)
    tok.train_from_iterator(
        [t for t, _ in train],
        trainer=trainers.WordPieceTrainer(
            vocab_size=200, special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##", show_progress=False
        ),
    )
    out.mkdir(parents=True, exist_ok=True)
    tok_path = out / "tokenizer.json"
    tok_path.write_text(tok.to_str(), encoding="utf-8")
    files = {}
    for role, data in (("train", train), ("validation", valid)):
        path = out / f"{role}.tsv"
        path.write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in data), encoding="utf-8")
        files[role] = str(path)
    task = {
        "source": "local",
        "local": files,
        "text_columns": ["text"],
        "label_column": "label",
        "label_names": ["neg", "pos"],
    }
    return task, tok_path


# ----------------------------------------------------------------------------- the checks


class Ctx:
    def __init__(self, args):
        self.cpu = args.cpu
        self.cuda = torch.cuda.is_available() and not args.cpu
        self.device = "cuda" if self.cuda else "cpu"
        self.minutes = args.minutes if not args.cpu else 0.03
        self.work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self._examples = Path(args.examples) if args.examples else None
        self._small = None

    @property
    def examples(self) -> Path:
        """The speed checks' shards: the gpu profile's sizes (vocabulary 15,774, length 128)."""
        if self._examples is None:
            rows = 512 if self.cpu else 200_000
            self._examples = synth_examples(
                self.work / "examples",
                rows=rows,
                valid_rows=256 if self.cpu else 5120,
                vocab=1000 if self.cpu else 15_774,
                seq_len=64 if self.cpu else 128,
                row_group_size=64 if self.cpu else 512,
            )
        return self._examples

    @property
    def small(self) -> Path:
        """Shards for the correctness checks (resume, exact, ddp): small and quick."""
        if self._small is None:
            self._small = synth_examples(
                self.work / "small", rows=2048, valid_rows=128, vocab=1000, seq_len=64, row_group_size=128
            )
        return self._small

    def model(self, kind: str) -> dict:
        if self.cpu:
            return dict(TINY)
        if kind == "speed":  # the gpu profile's model
            return {"preset": "base", "dropout": 0.1, "attention_dropout": 0.1, "pad_vocab_to_multiple_of": 64}
        return {"preset": "mini", "max_position": 128}


def _cfg(ctx: Ctx, **kw):
    from pipeline.pretrain.config import PretrainConfig

    base = dict(
        model=ctx.model("speed"),
        batch_size=16 if ctx.cpu else 256,
        lr=2e-4,
        warmup=0.06,
        max_steps=None,
        time_minutes=ctx.minutes,
        eval_every=0,
        eval_batches=2,
        log_every=10,
        checkpoint_every=None,
        checkpoint_minutes=None,
        snapshot_steps=[],
        snapshot_minutes=[],
        device=ctx.device,
        deterministic=False,
        num_threads=1 if ctx.cpu else 0,
        shuffle_buffer=2048,
    )
    base.update(kw)
    return PretrainConfig(**base)


def _pretrain(cfg, examples: Path, out: Path, **kw) -> dict:
    from pipeline.pretrain.loop import pretrain

    return pretrain(cfg, examples_dir=examples, out_dir=out, provenance={}, progress=False, **kw)


def _speed(result: dict, metrics: dict) -> dict:
    result.update(tokens_per_s=metrics.get("tokens_per_s"), mfu=metrics.get("mfu"), steps=metrics.get("step"))
    return result


def check_precision(ctx: Ctx, precision: str) -> dict:
    if precision == "fp16" and not ctx.cuda:
        return {"status": "SKIP", "note": "fp16 autocast needs CUDA"}
    from pipeline.core.device import bf16_native

    if precision == "bf16" and ctx.cuda and not bf16_native():
        return {"status": "SKIP", "note": "no native bf16 on this GPU (auto picks fp16)"}
    cfg = _cfg(ctx, precision=precision if ctx.cuda else "fp32")
    metrics = _pretrain(cfg, ctx.examples, ctx.work / f"out-{precision}")
    ok = metrics["completed"] and metrics["step"] > 1 and np.isfinite(metrics["loss"])
    return _speed(
        {
            "status": "PASS" if ok else "FAIL",
            "note": f"loss {metrics['loss']:.3f}, {metrics['precision']}, {metrics['train_seconds']:.0f} s",
        },
        metrics,
    )


def check_resume(ctx: Ctx) -> dict:
    """Item 1: an unfused (CPU) checkpoint continued with fused AdamW + GradScaler (fp16)."""
    out = ctx.work / "out-resume"
    steps = dict(
        max_steps=8, time_minutes=None, model=ctx.model("small"), batch_size=32, log_every=1, deterministic=True
    )
    _pretrain(_cfg(ctx, device="cpu", precision="fp32", num_threads=1, **steps), ctx.small, out, stop_at_step=4)
    metrics = _pretrain(_cfg(ctx, precision="fp16" if ctx.cuda else "fp32", **steps), ctx.small, out)
    state = torch.load(out / "last.pt", weights_only=True)
    fused = {g.get("fused") for g in state["optimizer"]["param_groups"]}
    ok = metrics["step"] == 8 and np.isfinite(metrics["loss"]) and (not ctx.cuda or fused == {True})
    return {
        "status": "PASS" if ok else "FAIL",
        "steps": metrics["step"],
        "note": f"CPU fp32 checkpoint -> {metrics['device']} {metrics['precision']}, fused AdamW {fused}",
    }


def check_exact(ctx: Ctx) -> dict:
    """docs/scaling.md's claim: bit-for-bit resume with deterministic: true (and whether false drifts)."""
    notes, ok = [], True
    for det in (True, False):
        kw = dict(
            max_steps=12,
            time_minutes=None,
            model=ctx.model("small"),
            batch_size=32,
            log_every=1,
            deterministic=det,
            precision="bf16" if ctx.cuda else "fp32",
            eval_every=6,
        )
        full = _pretrain(_cfg(ctx, **kw), ctx.small, ctx.work / f"exact-{det}-full")
        _pretrain(_cfg(ctx, **kw), ctx.small, ctx.work / f"exact-{det}-parts", stop_at_step=5)
        parts = _pretrain(_cfg(ctx, **kw), ctx.small, ctx.work / f"exact-{det}-parts")
        same = full["model_sha256"] == parts["model_sha256"]
        notes.append(f"deterministic {str(det).lower()}: {'identical' if same else 'differs'}")
        ok = ok and (same or not det)  # only deterministic: true promises it
    return {"status": "PASS" if ok else "FAIL", "note": "; ".join(notes)}


def check_compile(ctx: Ctx) -> dict:
    """Item 4: compile: true with a time budget; the clock starts after the compiled first update."""
    cfg = _cfg(ctx, compile=True, precision="bf16" if ctx.cuda else "fp32")
    patch = contextlib.nullcontext()
    if ctx.cpu:  # Inductor takes minutes on a CPU; the smoke test only needs dynamo's tracing
        real = torch.compile
        patch = _patched(torch, "compile", lambda m, **kw: real(m, backend="eager", **kw))
    t0 = time.perf_counter()
    with patch:
        metrics = _pretrain(cfg, ctx.examples, ctx.work / "out-compile")
    wall = time.perf_counter() - t0
    ok = metrics["completed"] and metrics["step"] > 1 and metrics["train_seconds"] <= ctx.minutes * 60 + 30
    return _speed(
        {
            "status": "PASS" if ok else "FAIL",
            "note": f"compile + setup {wall - metrics['train_seconds']:.0f} s outside the "
            f"{ctx.minutes:g}-minute budget",
        },
        metrics,
    )


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def check_ddp(ctx: Ctx) -> dict:
    """Items 2, 3, 5, 6 on real processes: torchrun, 2 ranks, the stage entry point, then a resume."""
    import yaml

    work = ctx.work / "ddp"
    (work / "data").mkdir(parents=True)
    (work / "data" / "examples").symlink_to(ctx.small)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "BERTRACE_NO_MLFLOW": "1",
        "TQDM_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
    }
    gpus = torch.cuda.device_count() if ctx.cuda else 0
    notes = []
    # the second run resumes rank 0's last.pt through its broadcast (smoke mode: one run, the tests cover resume)
    for steps in (6,) if ctx.cpu else (6, 12):
        params = {
            "compute": {"kernels": "portable"},
            "pretrain": {
                "model": ctx.model("small"),
                "batch_size": 32,
                "max_steps": steps,
                "eval_every": 6,
                "eval_batches": 2,
                "log_every": 2,
                "checkpoint_every": 6,
                "snapshot_steps": [],
                "device": "cuda:0" if ctx.cuda else "cpu",
                "num_threads": 1 if ctx.cpu else 0,
                "verify_shards": False,
            },
        }
        (work / "params.yaml").write_text(yaml.safe_dump(params))
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                "-m",
                "stages.pretrain",
            ],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )
        if p.returncode != 0:
            return {"status": "FAIL", "note": f"torchrun exit {p.returncode}: {(p.stdout + p.stderr)[-800:]}"}
        metrics = json.loads((work / "reports" / "pretrain.json").read_text())
        if metrics["step"] != steps or metrics["world_size"] != 2:
            return {"status": "FAIL", "note": f"step {metrics['step']} (want {steps}), world {metrics['world_size']}"}
        notes.append(f"{steps} steps")
    shared = " (one GPU shared over gloo)" if ctx.cuda and gpus < 2 else ""
    return _speed({"status": "PASS", "note": f"2 ranks{shared}: {', then resumed to '.join(notes)}"}, metrics)


def check_finetune(ctx: Ctx) -> dict:
    """Item 10: fine-tuning and evaluation (autocast on CUDA) learn a trivially learnable task."""
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.finetune.loop import FinetuneConfig, train_seed
    from pipeline.finetune.task_data import load_task_data
    from pipeline.models.bert import BertForPreTraining, config_from_params

    task, tok_path = synth_task(ctx.work / "task", 400 if ctx.cpu else 20_000, 200 if ctx.cpu else 2000)
    config = config_from_params(ctx.model("speed" if ctx.cuda else "small"), vocab_size=1000)
    torch.manual_seed(0)
    ckpt = {"model": BertForPreTraining(config).state_dict(), "model_config": config.to_dict()}
    data = load_task_data(task, load_tokenizer(tok_path), max_len=32)
    cfg = FinetuneConfig(
        epochs=3 if ctx.cpu else 2,
        batch_size=16 if ctx.cpu else 32,
        lr=3e-3 if ctx.cpu else 1e-4,
        seeds=[0],
        patience=0,
        device=ctx.device,
    )
    result = train_seed(ckpt, data, cfg, 0, progress=False)
    per_s = result.steps * cfg.batch_size / result.wall_seconds
    ok = result.validation_accuracy >= 0.8
    return {
        "status": "PASS" if ok else "FAIL",
        "steps": result.steps,
        "examples_per_s": round(per_s, 1),
        "note": f"{per_s:.0f} examples/s, validation accuracy {result.validation_accuracy:.3f}",
    }


RUNNERS = {
    "bf16": lambda c: check_precision(c, "bf16"),
    "fp16": lambda c: check_precision(c, "fp16"),
    "resume": check_resume,
    "exact": check_exact,
    "compile": check_compile,
    "ddp": check_ddp,
    "finetune": check_finetune,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="smoke mode: tiny sizes on the CPU (what the test runs)")
    ap.add_argument("--minutes", type=float, default=2.0, help="wall-clock budget of each speed check")
    ap.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    ap.add_argument("--examples", help="an examples directory (data/examples) instead of synthetic shards")
    ap.add_argument("--out", help="JSON report (default $OUT/gpu_check.json or ./gpu_check.json)")
    args = ap.parse_args(argv)
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = sorted(set(only) - set(CHECKS))
    if unknown:
        ap.error(f"unknown checks {unknown}; choose from {','.join(CHECKS)}")
    ctx = Ctx(args)
    if ctx.cpu:
        torch.set_num_threads(1)  # tiny models: more threads only add synchronisation
    header = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": ctx.device,
        "gpu": torch.cuda.get_device_name(0) if ctx.cuda else None,
        "gpus": torch.cuda.device_count() if ctx.cuda else 0,
    }
    print(f"gpu_check: {json.dumps(header)}", flush=True)
    results = {}
    try:
        for name in only:
            t0 = time.perf_counter()
            try:
                r = RUNNERS[name](ctx)
            except Exception as e:  # a failed check is a result, not the end of the script
                r = {
                    "status": "FAIL",
                    "note": f"{type(e).__name__}: {str(e)[:600]}",
                    "traceback": traceback.format_exc()[-3000:],
                }
            r["seconds"] = round(time.perf_counter() - t0, 1)
            results[name] = r
            line = (
                f"{name:9s} {r['status']:4s} {r['seconds']:7.1f} s  tokens/s {r.get('tokens_per_s') or '-'!s:>10}  "
                f"MFU {r.get('mfu') if r.get('mfu') is not None else '-'!s:>6}  {r.get('note', '')}"
            )
            print(line, flush=True)
    finally:
        shutil.rmtree(ctx.work, ignore_errors=True)
    out = Path(args.out) if args.out else Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**header, "checks": results}, indent=1))
    failed = [n for n, r in results.items() if r["status"] == "FAIL"]
    print(
        f"gpu_check: {len(results) - len(failed)}/{len(results)} passed or skipped"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
        + f"; report {out}",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
