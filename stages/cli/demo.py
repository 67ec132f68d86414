"""``bertrace demo [--model data/finetune/model.pt] [--port N]``: the model on a web page.

Serves the fine-tuned model with Gradio on http://127.0.0.1:PORT (only this machine): a text
box, the model's answer (label probabilities; tags for NER, a score for regression, streamed
text for a causal LM) and the checkpoint's trace summary beside it. Ctrl-C stops it.
Gradio is an optional extra: ``pip install -e '.[demo]'``. Logic: pipeline/apps/demo.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_MODEL = Path("data/finetune/model.pt")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bertrace demo", description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument(
        "--model",
        "-m",
        type=Path,
        default=DEFAULT_MODEL,
        help=f"fine-tuned checkpoint, or a causal-LM pre-training checkpoint (default {DEFAULT_MODEL})",
    )
    p.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: the first free one from 7860)")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps")
    p.add_argument("--root", default=".", help="repository the trace summary resolves MLflow / paths from (default .)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    from pipeline.apps import demo

    demo.require_gradio()  # before loading a model: the install hint comes first
    from pipeline.core.device import resolve_device

    model = demo.load_model(args.model, device=resolve_device(args.device, "--device"))
    app = demo.build_app(model, demo.trace_summary(args.model, args.root))
    print(
        f"bertrace demo: {model.kind} model {args.model} ({model.device}) on http://127.0.0.1:{args.port or '<first free from 7860>'}"
        " (Ctrl-C stops it)",
        flush=True,
    )
    demo.serve(app, args.port, block=True)


if __name__ == "__main__":
    import sys

    from stages.common import run_stage

    run_stage(lambda: main(sys.argv[1:]))
