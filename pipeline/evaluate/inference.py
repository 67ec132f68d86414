"""Inference with a fine-tuned checkpoint (``data/finetune/model.pt``): texts in, labels out.

Texts are encoded exactly as fine-tuning encoded them (:func:`pipeline.finetune.encoding.encode_examples`
with the checkpoint's ``max_len`` and ``truncation``), with the tokenizer the checkpoint was
trained with: ``tokenizer.json`` next to the checkpoint, whose sha256 must equal the one the
checkpoint records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from pipeline.core.errors import BertraceError
from pipeline.finetune.tasks.base import TaskType
from pipeline.finetune.tasks.registry import get as get_task
from pipeline.models.checkpoint import check_finetuned, check_tokenizer_hash, load_finetuned, load_weights


@dataclass
class Classifier:
    """A fine-tuned BertForSequenceClassification with its tokenizer, in eval mode."""

    model: torch.nn.Module
    tokenizer: Any  # tokenizers.Tokenizer
    label_names: list[str]
    text_columns: list[str]
    max_len: int
    truncation: str
    checkpoint: dict[str, Any]  # everything but the weights
    path: Path
    device: torch.device
    task_type: str = "classification"  # | token_classification | regression (the checkpoint's task.type)

    @classmethod
    def load(
        cls, path: str | Path, tokenizer_path: str | Path | None = None, device: str | torch.device = "cpu"
    ) -> "Classifier":
        """Load ``model.pt`` and the ``tokenizer.json`` next to it (or ``tokenizer_path``),
        checking the tokenizer's sha256 against the checkpoint."""
        path = Path(path)
        return cls.from_checkpoint(load_finetuned(path), path, tokenizer_path, device)

    @classmethod
    def from_checkpoint(
        cls,
        ckpt: dict[str, Any],
        path: str | Path,
        tokenizer_path: str | Path | None = None,
        device: str | torch.device = "cpu",
    ) -> "Classifier":
        """As :meth:`load`, for a checkpoint dict already read from ``path``."""
        from tokenizers import Tokenizer

        from pipeline.models.bert import BertConfig

        path = Path(path)
        check_finetuned(ckpt, path)
        task_type = str(ckpt["task"]["type"])  # read_checkpoint upgrade()d an older layout
        tokenizer_path = Path(tokenizer_path) if tokenizer_path else path.parent / "tokenizer.json"
        check_tokenizer_hash(tokenizer_path, ckpt["tokenizer_sha256"], path)
        tokenizer = Tokenizer.from_file(str(tokenizer_path))

        config = BertConfig.from_dict(ckpt["model_config"])
        if tokenizer.get_vocab_size() > config.vocab_size:
            raise BertraceError(
                f"{tokenizer_path}: vocabulary of {tokenizer.get_vocab_size()} tokens is larger than "
                f"the model's {config.vocab_size}; use the checkpoint's own tokenizer"
            )
        head = get_task(task_type).head_class()
        if ckpt["architecture"] == "gpt":  # fine-tuned from a clm checkpoint: last-token pooling
            from pipeline.models.gpt import GPTForSequenceClassification as head
        model = head(config, int(ckpt["num_labels"]))
        load_weights(model, ckpt["model"], path)
        device = torch.device(device)
        model.to(device).eval()
        task = ckpt["task"] or {}
        label_names = [str(n) for n in ckpt["label_names"]]
        if not get_task(task_type).outputs_match(len(label_names), int(ckpt["num_labels"])):
            raise BertraceError(f"{path}: {len(label_names)} label names for {ckpt['num_labels']} labels")
        meta = {k: v for k, v in ckpt.items() if k != "model"}
        return cls(
            model,
            tokenizer,
            label_names,
            list(task.get("text_columns") or ["text"]),
            int(task.get("max_len") or config.max_position),
            str(task.get("truncation") or "head"),
            meta,
            path,
            device,
            task_type,
        )

    @property
    def task(self) -> TaskType:
        """The checkpoint's task type (:mod:`pipeline.finetune.tasks.registry`)."""
        return get_task(self.task_type)

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    # -- encoding ---------------------------------------------------------------------------
    def encode(self, texts: Sequence[str] | Sequence[tuple[str, str]]) -> tuple[list[list[int]], list[list[int]]]:
        """``(input_ids, token_type_ids)`` per text, as fine-tuning encoded its data (a single
        string counts as a list of one)."""
        from pipeline.finetune.encoding import encode_examples

        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            return [], []
        pairs = [isinstance(t, (tuple, list)) for t in texts]
        if self.is_pair:
            if not all(pairs) or any(len(t) != 2 for t in texts):
                raise BertraceError(
                    f"this model classifies sentence pairs ({' + '.join(self.text_columns)}); "
                    "give (text_a, text_b) pairs"
                )
            a, b = [str(t[0]) for t in texts], [str(t[1]) for t in texts]
        else:
            if any(pairs):
                raise BertraceError(
                    f"this model classifies single texts ({self.text_columns[0]}); give strings, not pairs"
                )
            a, b = [str(t) for t in texts], None
        ids, types, _ = encode_examples(self.tokenizer, a, b, self.max_len, self.truncation)
        return ids, types

    # -- model ------------------------------------------------------------------------------
    def _sorted_batches(
        self,
        input_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int]],
        batch_size: int,
        progress: bool,
    ):
        """``(indices, logits)`` per batch of length-sorted sequences (little padding; padding is
        masked, so the logits do not depend on the batching), under the device's autocast."""
        from pipeline.core.device import amp_dtype
        from pipeline.finetune.encoding import collate_task_batch

        if batch_size < 1:
            raise BertraceError(f"batch_size must be at least 1, got {batch_size}")
        amp = amp_dtype(self.device)  # bf16 (fp16 on older GPUs) autocast on CUDA, fp32 elsewhere
        n = len(input_ids)
        self.model.eval()
        order = sorted(range(n), key=lambda i: len(input_ids[i]))
        starts = range(0, n, batch_size)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="predict", unit="batch")
        for s in starts:
            idx = order[s : s + batch_size]
            batch = collate_task_batch([(input_ids[i], token_type_ids[i], 0) for i in idx])
            with torch.autocast(self.device.type, dtype=amp or torch.float32, enabled=amp is not None):
                logits = self.model(
                    batch["input_ids"].to(self.device),
                    batch["token_type_ids"].to(self.device),
                    batch["attention_mask"].to(self.device),
                )
            yield idx, logits.float().cpu().numpy()

    @torch.no_grad()
    def logits_from_ids(
        self,
        input_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int]],
        batch_size: int = 64,
        progress: bool = False,
    ) -> np.ndarray:
        """Logits ``[N, num_labels]`` (float32) for encoded sequences, in input order.

        Batches are formed from length-sorted sequences (little padding); padding is masked,
        so the result does not depend on the batching.
        """
        if self.task.token_level:
            raise BertraceError(
                "logits_from_ids: a token classification model gives logits per position; use token_logits_from_ids"
            )
        n = len(input_ids)
        out = np.zeros((n, int(self.model.num_labels)), dtype=np.float32)
        if n == 0:
            return out
        for idx, logits in self._sorted_batches(input_ids, token_type_ids, batch_size, progress):
            out[idx] = logits
        return out

    @torch.no_grad()
    def token_logits_from_ids(
        self,
        input_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int]],
        batch_size: int = 64,
        progress: bool = False,
    ) -> list[np.ndarray]:
        """Token classification: per sequence its logits ``[T_i, num_labels]`` (float32), in input
        order, batched as :meth:`logits_from_ids`."""
        if batch_size < 1:
            raise BertraceError(f"batch_size must be at least 1, got {batch_size}")
        out: list[np.ndarray] = [np.zeros((0, len(self.label_names)), dtype=np.float32)] * len(input_ids)
        for idx, logits in self._sorted_batches(input_ids, token_type_ids, batch_size, progress):
            for j, i in enumerate(idx):
                out[i] = logits[j, : len(input_ids[i])]
        return out

    def logits(self, texts: Sequence[str] | Sequence[tuple[str, str]], batch_size: int = 64) -> np.ndarray:
        ids, types = self.encode(texts)
        return self.logits_from_ids(ids, types, batch_size=batch_size)

    def predict(self, texts: Sequence[str] | Sequence[tuple[str, str]], batch_size: int = 64) -> list[dict[str, Any]]:
        """``[{"label": name, "label_id": int, "probabilities": {name: p}}]``, one per text;
        regression: ``[{"score": float}]``; token classification: ``[{"entities": [{type, text,
        start, end}], "words": [...], "tags": [...]}]`` (:meth:`tag`)."""
        return self.task.predict(self, texts, batch_size)

    def tag(self, texts: Sequence[str], batch_size: int = 64) -> list[dict[str, Any]]:
        """Named entities of raw texts: the tokenizer's pre-tokenizer splits each text into words
        (whitespace and punctuation), a word's tag is read at its first sub-token (words beyond
        ``max_len`` are tagged O), BIO tags become spans with character offsets into the text."""
        from pipeline.finetune.token_data import encode_text, spans, word_predictions

        texts = [texts] if isinstance(texts, str) else [str(t) for t in texts]
        encs = [encode_text(self.tokenizer, t, self.max_len) for t in texts]
        logits = self.token_logits_from_ids(
            [e["input_ids"] for e in encs], [e["token_type_ids"] for e in encs], batch_size=batch_size
        )
        out = []
        for text, enc, lg in zip(texts, encs, logits):
            tags = word_predictions(lg, enc["first"], self.label_names)
            out.append(
                {
                    "entities": spans(text, tags, enc["offsets"]),
                    "words": [text[s:e] for s, e in enc["offsets"]],
                    "tags": tags,
                }
            )
        return out

    def format(self, logits: np.ndarray) -> list[dict[str, Any]]:
        """The task type's predictions of ``logits`` (:meth:`~pipeline.finetune.tasks.base.TaskType.format_predictions`)."""
        return self.task.format_predictions(logits, self.label_names)
