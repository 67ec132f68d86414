"""Examples generation: ours vs Google's ``create_pretraining_data.py``, same corpus, vocab, params.

Both get the same clean corpus (our clean stage on the first N files of the WikiExtractor
extract in ../shared/data) and the same ``vocab.txt`` (our tokenizer stage; Google's
FullTokenizer reads it, do_lower_case=True), with max_seq_len 128, dupe_factor 5,
masked_lm_prob 0.15, short_seq_prob 0.1, max_predictions_per_seq 20. Google's script wants
one sentence per line and a blank line between documents: the bench writes that from our
clean train.txt with our sentence splitter, untimed (so the peer gets sentence splitting for
free; ours is timed with it). Each command runs as its own process, timed from start to exit
(interpreter start and imports included); examples/s = train examples / wall seconds; memory =
peak RSS summed over the process tree (our worker processes included), and peak PSS summed
over it (shared library pages split between the processes mapping them; see measure.py).

The corpus size is ``--source enwikiN`` (the first N ~1 MB files of the extract; 100 exist).
Google's script holds every document and instance in memory, so its peak grows with N (and
its time: ~8 s per MB on one core); ours is bounded by the partition size.

    python bench/bench_examples.py --google-bert /path/to/google-research/bert \\
        --peer-python /path/to/venv-with-tensorflow/bin/python [--source enwiki50]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

import corpus  # noqa: E402
import measure  # noqa: E402

PARAMS = dict(
    max_seq_length=128,
    max_predictions_per_seq=20,
    masked_lm_prob=0.15,
    dupe_factor=5,
    short_seq_prob=0.1,
    random_seed=12345,
)


def google_input(train_txt: Path, out: Path) -> None:
    from pipeline.data.sentences import split_sentences

    with open(train_txt, encoding="utf-8") as fin, open(out, "w", encoding="utf-8") as fout:
        for line in fin:
            fout.write("\n".join(split_sentences(line.strip())) + "\n\n")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--google-bert", required=True, type=Path, help="checkout of google-research/bert")
    p.add_argument("--peer-python", default=sys.executable, help="a Python with tensorflow (tensorflow-cpu)")
    p.add_argument("--source", default="enwiki10", help="enwikiN: the first N 1-MB files of the extract")
    p.add_argument("--workers", type=int, default=0, help="ours: 0 = all cores")
    p.add_argument("--docs-per-shard", type=int, default=64)
    p.add_argument("--work", type=Path, default=BENCH / "out" / "examples")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    script = args.google_bert / "create_pretraining_data.py"
    if not (script.exists() and (args.google_bert / "tokenization.py").exists()):
        raise SystemExit(
            f"{args.google_bert}: no create_pretraining_data.py + tokenization.py; pass a checkout of "
            "google-research/bert"
        )

    work = corpus.prepare(args.source, 1, args.work / args.source, valid_fraction=0.02)
    clean, tok_dir = work / "clean", work / "tokenizer"
    g_in = work / "google_input.txt"
    if not g_in.exists():
        google_input(clean / "train.txt", g_in)

    peer = measure.run(
        [
            args.peer_python,
            str(BENCH / "google_peer.py"),
            str(script),
            f"--input_file={g_in}",
            f"--output_file={work / 'google.tfrecord'}",
            f"--vocab_file={tok_dir / 'vocab.txt'}",
            "--do_lower_case=True",
            *(f"--{k}={v}" for k, v in PARAMS.items()),
        ]
    )
    m = re.search(r"Wrote (\d+) total instances", peer.stderr)
    if not m:
        raise SystemExit(f"peer: no 'Wrote N total instances' in its log:\n{peer.stderr[-2000:]}")
    peer_rows = int(m.group(1))

    ours = measure.run(
        [
            sys.executable,
            str(BENCH / "stage_runner.py"),
            "examples",
            str(clean),
            str(tok_dir / "tokenizer.json"),
            str(work / "ours"),
            "--workers",
            str(args.workers),
            "--docs-per-shard",
            str(args.docs_per_shard),
        ]
    )
    our_rows = json.loads(ours.stdout.strip().splitlines()[-1])["train"]["rows"]
    (work / "google.tfrecord").unlink()  # outputs: ~9 MB per MB of text each; the prepared corpus stays
    shutil.rmtree(work / "ours")

    result = {
        "corpus": {
            "source": args.source,
            "train_bytes": (clean / "train.txt").stat().st_size,
            "train_documents": sum(1 for _ in open(clean / "train.txt", encoding="utf-8")),
        },
        "peer": {
            "examples": peer_rows,
            "wall_s": peer.wall_s,
            "examples_per_s": peer_rows / peer.wall_s,
            "peak_rss_mb": peer.peak_tree_mb,
            "peak_pss_mb": peer.peak_pss_mb,
            "cpu_s": peer.cpu_s,
        },
        "ours": {
            "examples": our_rows,
            "wall_s": ours.wall_s,
            "examples_per_s": our_rows / ours.wall_s,
            "peak_rss_mb": ours.peak_tree_mb,
            "peak_rss_largest_process_mb": ours.peak_proc_mb,
            "peak_pss_mb": ours.peak_pss_mb,
            "cpu_s": ours.cpu_s,
            "workers": args.workers,
            "docs_per_shard": args.docs_per_shard,
        },
    }
    result["ratio"] = {
        "examples_per_s": result["ours"]["examples_per_s"] / result["peer"]["examples_per_s"],
        "peak_rss": result["ours"]["peak_rss_mb"] / result["peer"]["peak_rss_mb"],
        "peak_pss": result["ours"]["peak_pss_mb"] / max(result["peer"]["peak_pss_mb"], 1e-9),
    }
    print(f"examples on {args.source} ({result['corpus']['train_bytes'] / 1e6:.1f} MB clean train text)")
    print(
        f"{'':8s} {'examples':>9s} {'wall s':>8s} {'examples/s':>11s} {'peak RSS MB':>12s} {'peak PSS MB':>12s} "
        f"{'CPU s':>7s}"
    )
    for name in ("peer", "ours"):
        r = result[name]
        print(
            f"{name:8s} {r['examples']:9d} {r['wall_s']:8.2f} {r['examples_per_s']:11.0f} {r['peak_rss_mb']:12.0f} "
            f"{r['peak_pss_mb']:12.0f} {r['cpu_s']:7.2f}"
        )
    print(
        f"ratio    examples/s ours/peer = {result['ratio']['examples_per_s']:.1f}x (goal >= 20x), "
        f"peak RSS ours/peer = {result['ratio']['peak_rss']:.2f}, peak PSS ours/peer = "
        f"{result['ratio']['peak_pss']:.2f} (goal <= 0.25)"
    )
    return measure.save_result(args.json, result)


if __name__ == "__main__":
    main()
