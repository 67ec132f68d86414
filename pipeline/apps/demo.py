"""The demo page (``bertrace demo``): a fine-tuned model behind a text box, served by Gradio.

As the Bengali BERT this project learned from offers its model in a browser: type a text, see
what the model makes of it, and beside it the checkpoint's trace summary (the chain of stages,
commits and params behind it, :mod:`pipeline.lineage.trace`), so a person trying the model also sees
which run made it.

The page has one small render function per kind of model (:data:`RENDERERS`), each laying out
its inputs and its output inside the shared page and wiring the button:

* ``classification``: label probabilities (``gr.Label``, all classes; two text boxes for a
  sentence-pair task), from :class:`pipeline.evaluate.inference.Classifier`;
* ``regression``: the predicted score (a similarity / rating head, ``task.type: regression``);
* ``token_classification``: the text with its entity spans highlighted (NER tags, read at each
  word's first sub-token by :meth:`Classifier.tag`);
* ``causal_lm``: a pre-training checkpoint of ``pretrain.objective: clm``, whose continuation
  of the prompt is streamed as it is sampled (:func:`pipeline.apps.generate.generate_text`).

Gradio is an optional extra (``pip install -e '.[demo]'``); nothing here imports it before
:func:`build_app`. The server listens on 127.0.0.1 only and sends no telemetry
(``analytics_enabled=False``; the default theme's fonts are bundled, so the page works offline).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.core.errors import BertraceError

KINDS = ("classification", "regression", "token_classification", "causal_lm")
INSTALL_HINT = "pip install -e '.[demo]'"
# element ids of the shared page (tests/unit/apps/test_demo.py drives the page through them)
IDS = {
    "input": "demo-input",
    "input_b": "demo-input-b",
    "run": "demo-run",
    "output": "demo-output",
    "trace": "demo-trace",
}


def require_gradio():
    """The gradio module, or a BertraceError saying how to install the optional extra."""
    try:
        import gradio
    except ImportError:
        raise BertraceError(f"bertrace demo needs Gradio, an optional extra: {INSTALL_HINT}") from None
    return gradio


# --------------------------------------------------------------------------------------------
# The model behind the page


@dataclass
class DemoModel:
    """A loaded checkpoint and what kind of page it gets."""

    kind: str  # one of KINDS
    path: Path
    model: Any  # a Classifier; for causal_lm the GPT
    tokenizer: Any = None  # causal_lm only (a Classifier carries its own)
    meta: dict[str, Any] = field(default_factory=dict)  # the checkpoint without its weights

    @property
    def device(self) -> str:
        return str(next(self.torch_module.parameters()).device)

    @property
    def torch_module(self):
        return self.model if self.kind == "causal_lm" else self.model.model

    @property
    def title(self) -> str:
        task = (self.meta.get("task") or {}) if isinstance(self.meta.get("task"), dict) else {}
        src = next((task[k] for k in ("source", "hub") if isinstance(task.get(k), dict)), {})
        name = src.get("config") or src.get("dataset") or task.get("name")
        return f"bertrace demo: {self.kind.replace('_', ' ')}" + (f" ({name})" if name else "")


def load_model(path: str | Path, device: str | Any = "cpu") -> DemoModel:
    """Read ``path`` and pick the page: a fine-tuned checkpoint by its ``task.type``, a
    pre-training checkpoint only when it is a causal LM (a masked LM has nothing to show)."""
    from pipeline.apps.generate import load_causal_lm
    from pipeline.evaluate.inference import Classifier
    from pipeline.models.checkpoint import is_causal_state_dict, is_finetuned, read_checkpoint

    path = Path(path)
    ckpt = read_checkpoint(path)
    if is_finetuned(ckpt):
        clf = Classifier.from_checkpoint(ckpt, path, device=device)
        kind = getattr(clf, "task_type", "classification")
        if kind not in RENDERERS:
            raise BertraceError(f"{path}: task type {kind!r} has no demo page (known: {', '.join(KINDS)})")
        return DemoModel(kind, path, clf, meta=clf.checkpoint)
    if not is_causal_state_dict(ckpt["model"]):
        raise BertraceError(
            f"{path}: a masked-LM pre-training checkpoint, which the demo cannot show; serve a "
            "fine-tuned model (--model data/finetune/model.pt) or a causal LM "
            "(pretrain.objective: clm)"
        )
    del ckpt
    model, tokenizer, meta = load_causal_lm(path)
    return DemoModel("causal_lm", path, model.to(device), tokenizer, meta)


# --------------------------------------------------------------------------------------------
# Outputs, one function per kind (plain Python values: what the Gradio components display)


def classify(m: DemoModel, text: str, text_b: str | None = None) -> dict[str, float]:
    """``{label: probability}`` over every class (they sum to 1)."""
    clf = m.model
    item = (text, text_b or "") if clf.is_pair else text
    return clf.predict([item])[0]["probabilities"]


def score(m: DemoModel, text: str, text_b: str | None = None) -> float:
    clf = m.model
    item = (text, text_b or "") if clf.is_pair else text
    return float(clf.predict([item])[0]["score"])


def tag(m: DemoModel, text: str) -> dict[str, Any]:
    """The value of a ``gr.HighlightedText``: the text and its entity spans (character offsets)."""
    pred = m.model.tag([text])[0]
    return {
        "text": text,
        "entities": [{"entity": e["type"], "start": e["start"], "end": e["end"]} for e in pred["entities"]],
    }


def stream(
    m: DemoModel, prompt: str, max_new_tokens: int = 50, temperature: float = 1.0, seed: int = 0
) -> Iterator[str]:
    """The prompt and its sampled continuation, growing as tokens come (generation runs in a
    thread; each piece the decoder makes final is yielded with all before it)."""
    from pipeline.apps.generate import generate_text

    pieces: queue.Queue = queue.Queue()
    done = object()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            generate_text(
                m.model,
                m.tokenizer,
                prompt,
                int(max_new_tokens),
                temperature=float(temperature),
                seed=int(seed),
                on_text=pieces.put,
            )
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(e)
        finally:
            pieces.put(done)

    threading.Thread(target=work, daemon=True).start()
    text = ""
    while (piece := pieces.get()) is not done:
        text += piece
        yield text
    if errors:
        raise errors[0]
    yield text


# --------------------------------------------------------------------------------------------
# Trace summary


def trace_summary(path: str | Path, root: str | Path = ".") -> str:
    """The checkpoint's lineage condensed to one line per stage (Markdown): commit, params hash,
    finish time; the corpus source and how to reproduce it. What ``bertrace trace`` prints,
    without the per-file hashes."""
    from pipeline.lineage import trace

    try:
        lin = trace.lineage(path, root)
    except BertraceError as e:
        return f"**No trace**: {e}"
    lines = [f"**{lin['target']}**  ", f"{lin['kind']}, sha256 `{(lin.get('target_sha256') or '-')[:12]}`", ""]
    chain = lin.get("chain") or []
    if chain:
        lines += ["| stage | commit | params | finished |", "|---|---|---|---|"]
    for node in chain:
        commit = f"`{node['git_commit'][:10]}`" if node.get("git_commit") else "no git"
        dirty = " (dirty)" if node.get("git_dirty") else ""
        finished = str(node.get("finished") or "-").replace("T", " ")[:16]
        lines.append(f"| {node['stage']} | {commit}{dirty} | `{(node.get('params_hash') or '-')[:10]}` | {finished} |")
    if not chain:
        lines.append("(no stages recorded)")
    source = next((n["source"] for n in chain if n.get("source")), None)
    if source:
        lines += ["", f"corpus: {source}"]
    if lin.get("conflicts"):
        lines += ["", f"conflicting upstream records: {', '.join(lin['conflicts'])}"]
    head = chain[0] if chain else {}
    if head.get("git_commit"):
        lines += [
            "",
            f"reproduce: `git checkout {head['git_commit'][:12]} && dvc repro`"
            + (" (the tree was dirty)" if head.get("git_dirty") else ""),
        ]
    lines += ["", f"full record: `bertrace trace {lin['target']} --verify`"]
    return "\n".join(lines)


def model_facts(m: DemoModel) -> str:
    """One Markdown line about the model: labels, validation metric, size."""
    from pipeline.finetune.tasks.registry import get as get_task

    facts = []
    if m.kind != "causal_lm" and get_task(m.kind).has_label_names:
        names = m.model.label_names
        facts.append(f"labels: {', '.join(names[:12])}{' …' if len(names) > 12 else ''}")
    metrics = m.meta.get("metrics") if isinstance(m.meta.get("metrics"), dict) else {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and ("accuracy" in key or key in ("f1", "pearson", "spearman")):
            facts.append(f"{key.replace('_', ' ')} {value:.4g}")
            break
    params = sum(p.numel() for p in m.torch_module.parameters())
    facts.append(f"{params / 1e6:.2f} M parameters")
    return " · ".join(facts)


# --------------------------------------------------------------------------------------------
# The page: one render function per kind


def _text_inputs(gr, m: DemoModel, placeholder: str):
    """One text box, or two for a sentence-pair task (``task.text_columns``)."""
    cols = list(getattr(m.model, "text_columns", None) or ["text"])
    a = gr.Textbox(label=cols[0], placeholder=placeholder, lines=3, elem_id=IDS["input"])
    b = gr.Textbox(label=cols[1], lines=3, elem_id=IDS["input_b"]) if len(cols) == 2 else None
    return [a] if b is None else [a, b]


def render_classification(gr, m: DemoModel) -> None:
    inputs = _text_inputs(gr, m, "Type a sentence, e.g. a gripping , funny film")
    button = gr.Button("Classify", variant="primary", elem_id=IDS["run"])
    out = gr.Label(label="label probabilities", num_top_classes=len(m.model.label_names), elem_id=IDS["output"])
    fn = (lambda a, b: classify(m, a, b)) if len(inputs) == 2 else (lambda a: classify(m, a))
    button.click(fn, inputs, out)
    inputs[-1].submit(fn, inputs, out)


def render_regression(gr, m: DemoModel) -> None:
    inputs = _text_inputs(gr, m, "Type a sentence")
    button = gr.Button("Score", variant="primary", elem_id=IDS["run"])
    out = gr.Number(label="predicted score", precision=4, elem_id=IDS["output"])
    fn = (lambda a, b: score(m, a, b)) if len(inputs) == 2 else (lambda a: score(m, a))
    button.click(fn, inputs, out)
    inputs[-1].submit(fn, inputs, out)


def render_token_classification(gr, m: DemoModel) -> None:
    inputs = _text_inputs(gr, m, "Type a sentence, e.g. Alice moved from Paris to Berlin in 2019 .")
    button = gr.Button("Tag", variant="primary", elem_id=IDS["run"])
    out = gr.HighlightedText(label="entities (BIO tags as spans)", combine_adjacent=False, elem_id=IDS["output"])
    button.click(lambda a: tag(m, a), inputs[:1], out)
    inputs[0].submit(lambda a: tag(m, a), inputs[:1], out)


def render_causal_lm(gr, m: DemoModel) -> None:
    prompt = gr.Textbox(label="prompt", placeholder="Type the start of a text", lines=3, elem_id=IDS["input"])
    with gr.Row():
        n = gr.Slider(1, 200, value=50, step=1, label="max new tokens")
        t = gr.Slider(0.0, 2.0, value=1.0, step=0.05, label="temperature (0 = greedy)")
        seed = gr.Number(value=0, precision=0, label="seed")
    button = gr.Button("Generate", variant="primary", elem_id=IDS["run"])
    out = gr.Textbox(label="text (streamed)", lines=8, elem_id=IDS["output"])

    def generate(p, k, temp, s):  # a generator: Gradio shows each value as it comes
        yield from stream(m, p, k, temp, s)

    button.click(generate, [prompt, n, t, seed], out)


RENDERERS: dict[str, Callable[[Any, DemoModel], None]] = {
    "classification": render_classification,
    "regression": render_regression,
    "token_classification": render_token_classification,
    "causal_lm": render_causal_lm,
}


def build_app(m: DemoModel, trace_markdown: str | None = None):
    """The ``gr.Blocks`` page for ``m``: its kind's inputs and output on the left, the trace
    summary (default :func:`trace_summary` of ``m.path``) on the right."""
    gr = require_gradio()
    trace_markdown = trace_summary(m.path) if trace_markdown is None else trace_markdown
    with gr.Blocks(title=m.title, analytics_enabled=False) as app:
        gr.Markdown(f"## {m.title}\n`{m.path}` · {model_facts(m)}")
        with gr.Row():
            with gr.Column(scale=3):
                RENDERERS[m.kind](gr, m)
            with gr.Column(scale=2):
                gr.Markdown(f"### Trace\n{trace_markdown}", elem_id=IDS["trace"])
    return app


def serve(app, port: int | None = None, block: bool = True):
    """Launch ``app`` on 127.0.0.1 (``port`` None: Gradio picks a free one from 7860 up).
    Returns the local URL (with ``block=False``, the server keeps running in a thread)."""
    app.queue(default_concurrency_limit=1)  # one inference at a time: the model is shared
    _, url, _ = app.launch(
        server_name="127.0.0.1",
        server_port=port,
        share=False,
        inbrowser=False,
        prevent_thread_lock=not block,
        quiet=not block,
    )
    return url
