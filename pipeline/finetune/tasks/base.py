"""The task-type interface: what changes with ``finetune.task.type``, apart from how fine-tuning loops.

The loader (:mod:`pipeline.finetune.task_data`) reads the rows, the loop (:mod:`pipeline.finetune.loop`)
trains, evaluate / predict / serve / export use the fine-tuned model; a task type owns everything
that depends on *what* is predicted:

* data: which rows count as empty, how the label column is read and checked (``read_labels``),
  how kept rows become ids (``encode``), one example's label (``item_label``);
* model: the head (``head_class``, ``num_outputs``, ``pools``), the loss (``loss``);
* validation: per-split metrics (``evaluate``), the metric that picks the best check and seed
  (``selection``, higher is better: ``selection_value``), the per-seed and summary numbers;
* use: how predictions read (``predict``, ``format_predictions``, ``pyfunc_columns``), the
  transformers class and config fields of an export (``hf_fields``).

A new task type is a subclass in its own file under ``pipeline/finetune/tasks/``, registered in
``registry.py``; the loader, the loop and the stages do not change.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Sequence

import numpy as np
import torch

from pipeline.core.device import amp_dtype
from pipeline.core.errors import BertraceError
from pipeline.finetune.encoding import collate_task_batch, encode_examples
from pipeline.finetune.stats import best_seed, mean_std, seed_timings
from pipeline.finetune.task_files import Rows, cell_text
from pipeline.models.bert import BertForSequenceClassification


class TaskType:
    """Base class: a sequence-level task (one target per example, text or a text pair in). See the
    module docstring; subclasses set the class variables and override what differs."""

    name: ClassVar[str]
    selection: ClassVar[str]  # the validation metric that picks the best check and seed (higher is better)
    short: ClassVar[str]  # metrics/finetune.json's dev_<short>
    metric_title: ClassVar[str]  # the selection metric in the stage's console line
    title: ClassVar[str] = ""  # the evaluation report's "Task type: ..."
    evaluation: ClassVar[str] = "scores"  # the evaluate stage's path: accuracy | entities | scores
    dvc_keys: ClassVar[tuple[str, ...]] = ()  # metrics/eval.json's numbers per split
    token_level: ClassVar[bool] = False  # one label per word (per position), not per example
    has_label_names: ClassVar[bool] = True  # finetune.task.label_names names the outputs
    pools: ClassVar[bool] = True  # the head reads a pooled vector (finetune.pooling applies)
    fill_what: ClassVar[str] = "text"  # what an empty row lacks, in the skip warning
    hf_problem_type: ClassVar[str | None] = None  # transformers' config problem_type
    electra_export: ClassVar[bool] = False  # an ELECTRA model of this type exports to transformers

    # -- params and data ------------------------------------------------------------------------
    def check_params(self, params) -> None:
        """Refuse ``finetune.task`` settings this type cannot use (``params``: a TaskParams)."""

    def missing_label_names(self, rows_by_split: dict[str, Rows], label_column: str) -> BertraceError:
        """The error for empty ``label_names`` when the source names no classes either."""
        return BertraceError(
            "params.yaml: finetune.task.label_names is empty; list the class names in label order "
            "(e.g. [negative, positive])"
        )

    def check_label_names(self, label_names: list[str], where: str) -> None:
        """Refuse label names of the wrong shape (e.g. not BIO tags)."""

    def empty_rows(self, rows: Rows, text_columns: list[str]) -> np.ndarray:
        """Per row: True when a text column is empty, whitespace-only or null."""
        empty = np.zeros(len(rows.columns[text_columns[0]]), dtype=bool)
        for c in text_columns:
            for i, v in enumerate(rows.columns[c]):
                empty[i] |= not cell_text(v).strip()
        return empty

    def empty_text(self, text_columns: list[str]) -> str:
        return "empty text in " + " or ".join(repr(c) for c in text_columns)

    def read_labels(
        self, rows: Rows, text_columns: list[str], label_column: str, label_names: list[str], role: str, skip
    ) -> Any:
        """The labels of every row (None: an unlabelled split); rows in ``skip`` are not checked."""
        raise NotImplementedError

    def encode(
        self, tokenizer, rows: Rows, text_columns: list[str], labels, idx: np.ndarray, ctx: dict[str, Any]
    ) -> dict[str, Any]:
        """The TaskSplit fields of the rows ``idx`` (``ctx``: label_names, max_len, truncation, tables)."""
        texts = [[cell_text(rows.columns[c][i]) for i in idx] for c in text_columns]
        ids, types, n_cut = encode_examples(
            tokenizer, texts[0], texts[1] if len(texts) > 1 else None, ctx["max_len"], ctx["truncation"]
        )
        return {
            "input_ids": ids,
            "token_type_ids": types,
            "labels": None if labels is None else labels[torch.from_numpy(idx)],
            "truncated": n_cut,
        }

    def item_label(self, split, i: int) -> Any:
        """Example ``i``'s label as :func:`~pipeline.finetune.encoding.collate_task_batch` pads it."""
        raise NotImplementedError

    def label_counts(self, split, num_labels: int) -> list[int]:
        return []

    def num_outputs(self, label_names: Sequence[str]) -> int:
        """Outputs of the model's head."""
        return len(label_names)

    def outputs_match(self, n_names: int, num_labels: int) -> bool:
        """Whether a checkpoint's label names fit its head's outputs."""
        return n_names == num_labels

    def split_details(self, splits: dict[str, Any]) -> dict[str, Any]:
        """Type-specific per-role counts for reports/finetune.json."""
        return {}

    # -- model and loss -------------------------------------------------------------------------
    def head_class(self) -> type[torch.nn.Module]:
        return BertForSequenceClassification

    def check_decoder(self, source: str) -> None:
        """Refuse a causal (GPT) checkpoint when the type needs per-token outputs."""

    def collate(self, batch: Sequence[tuple[list[int], list[int], Any]]) -> dict[str, torch.Tensor]:
        return collate_task_batch(batch)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        raise NotImplementedError

    # -- validation -----------------------------------------------------------------------------
    def check_evaluable(self, label_names: list[str] | None) -> None:
        """Refuse to evaluate without what the metrics need."""

    def counted(self, labels: torch.Tensor, n: int) -> Any:
        """The batch's share of the loss denominator."""
        return n

    def outputs(self, logits: torch.Tensor) -> list[Any]:
        """One output per example, for :meth:`metrics`."""
        raise NotImplementedError

    def metrics(self, outputs: list[Any], split, label_names: list[str] | None, loss: float, n: int) -> dict:
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(
        self, model: torch.nn.Module, split, batch_size: int, device: torch.device, label_names: list[str] | None
    ) -> dict[str, float]:
        """The validation metrics of a labelled split (length-sorted batches, the device's autocast);
        ``loss`` is the training loss on the split."""
        self.check_evaluable(label_names)
        was_training = model.training
        model.eval()
        amp = amp_dtype(device)
        order = sorted(range(len(split)), key=lambda i: len(split.input_ids[i]))
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        count = torch.zeros((), dtype=torch.long, device=device)
        outputs: list[Any] = [None] * len(split)
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            batch = {k: v.to(device, non_blocking=True) for k, v in self.collate([split[i] for i in idx]).items()}
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).float()
            loss_sum += self.loss(logits, batch["labels"], reduction="sum").double()
            count += self.counted(batch["labels"], len(idx))
            for i, v in zip(idx, self.outputs(logits)):
                outputs[i] = v
        model.train(was_training)
        loss = loss_sum.item() / max(1, count.item())
        return self.metrics(outputs, split, label_names, loss, len(order))

    def selection_value(self, metrics: dict[str, Any]) -> float:
        """The number that ranks checks and seeds (higher is better; NaN counts as -inf)."""
        v = float(metrics[self.selection])
        return -math.inf if math.isnan(v) else v

    def history_point(self, step: int, epoch: float, ev: dict[str, Any], train_loss: float) -> dict[str, Any]:
        """One validation check of a seed's history."""
        return {
            "step": step,
            "epoch": epoch,
            **{f"validation_{k}": v for k, v in ev.items() if k != "n"},
            "train_loss": train_loss,
        }

    # -- results over seeds ---------------------------------------------------------------------
    def seed_score(self, result) -> float:
        """The selection metric of a SeedResult at its best check, NaN as -inf."""
        return self.selection_value(result.validation)

    def seed_metrics(self, result, out: dict[str, Any]) -> dict[str, Any]:
        """A SeedResult's numbers (``out``: the common ones): every validation metric."""
        out.pop("validation_accuracy")
        out.update({f"validation_{k}": v for k, v in result.validation.items() if k not in ("n", "loss")})
        return out

    def summarize(self, results: list) -> dict[str, Any]:
        """``validation_<metric>`` mean ± std for each metric (min / max too for the selection
        metric) and ``best_validation_<metric>``."""
        main = self.selection
        best = best_seed(results)
        out: dict[str, Any] = {
            "task_type": self.name,
            "seeds": [r.seed for r in results],
            "per_seed": {str(r.seed): r.metrics() for r in results},
        }
        keys = [main] + [k for k in results[0].validation if k not in (main, "n", "loss")]
        for k in keys:
            values = [float(r.validation.get(k, math.nan)) for r in results]
            mean, std = mean_std(values)
            out[f"validation_{k}"] = {"mean": mean, "std": std}
            if k == main:
                out[f"validation_{k}"].update(min=min(values), max=max(values))
        loss_mean, loss_std = mean_std([r.validation_loss for r in results])
        out["validation_loss"] = {"mean": loss_mean, "std": loss_std}
        out["best_seed"] = best.seed
        out[f"best_validation_{main}"] = float(best.validation.get(main, math.nan))
        out["timings"] = seed_timings(results)
        return out

    def checkpoint_metrics(self, summary: dict[str, Any], best, seeds: list[int]) -> dict[str, Any]:
        """The fine-tuned checkpoint's ``metrics``: the best seed's validation numbers and the
        selection metric's mean ± std over seeds."""
        main = self.selection
        return {
            "task_type": self.name,
            **{f"validation_{k}": v for k, v in best.validation.items() if k != "n"},
            f"validation_{main}_mean": summary[f"validation_{main}"]["mean"],
            f"validation_{main}_std": summary[f"validation_{main}"]["std"],
            "seeds": list(seeds),
        }

    # -- predictions, reports, export -----------------------------------------------------------
    def predict(self, clf, texts, batch_size: int) -> list[dict[str, Any]]:
        """One prediction per text (``clf``: a :class:`pipeline.evaluate.inference.Classifier`)."""
        return clf.format(clf.logits(texts, batch_size=batch_size))

    def format_predictions(self, logits: np.ndarray, label_names: list[str]) -> list[dict[str, Any]]:
        raise NotImplementedError

    def cli_prediction(self, pred: dict[str, Any]) -> dict[str, Any]:
        """What ``bertrace predict`` writes of a prediction."""
        return pred

    def pyfunc_columns(self, clf, inputs, batch_size: int) -> dict[str, Any]:
        """The MLflow pyfunc model's output columns."""
        raise NotImplementedError

    def describe(self, text_columns: list[str], label_names: list[str]) -> str:
        """The evaluation report's "task" row: what goes in, what comes out."""
        return f"{' + '.join(text_columns)} → score"

    def result_line(self, role: str, r: dict[str, Any]) -> str:
        """One split's numbers in the evaluate stage's console line."""
        return f"{role} {self.selection} {r[self.selection]:.4f} (n={r['n']})"

    def hf_fields(self, label_names: list[str], family: str) -> tuple[dict[str, Any], str]:
        """The transformers config fields of an export and its model class's name."""
        return (
            {
                "id2label": {i: n for i, n in enumerate(label_names)},
                "label2id": {n: i for i, n in enumerate(label_names)},
                "problem_type": self.hf_problem_type,
                "architectures": [f"{family}ForSequenceClassification"],
            },
            f"{family}ForSequenceClassification",
        )


__all__ = ["TaskType"]
