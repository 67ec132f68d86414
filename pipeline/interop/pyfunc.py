"""The fine-tuned classifier as an MLflow ``pyfunc`` model (logged by the evaluate stage).

``mlflow.pyfunc.load_model(uri).predict(DataFrame)`` returns labels and class probabilities. The
model carries the ``pipeline`` package as code, so it loads where bertrace is not installed.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.core.errors import BertraceError
from pipeline.core.io import sha256_file
from pipeline.evaluate.inference import Classifier

try:  # the pyfunc wrapper class must live at module level so MLflow can unpickle it by name
    import mlflow.pyfunc as _mlflow_pyfunc

    _PythonModel = _mlflow_pyfunc.PythonModel
except ImportError:  # pragma: no cover - mlflow is a core dependency
    _PythonModel = object

PROBE_TEXTS = [  # the logged model's input example; export's tokenizer/logit probes
    "A gripping, funny film -- the best of the year!",
    "Café au lait, naïve résumé: ACCENTS and Capitals.",
    "it 's a boring , pointless movie .",
    "Transformers (Vaswani et al., 2017) use self-attention; BERT pre-trains them on unlabeled text.",
]


class BertracePyfunc(_PythonModel):
    """MLflow pyfunc around :class:`pipeline.evaluate.inference.Classifier`.

    Input: a DataFrame with the task's text column(s) (e.g. ``sentence``; two for a pair task).
    Output: a DataFrame with ``label`` (name), ``label_id`` and ``prob_<label>`` per class.
    """

    def load_context(self, context) -> None:
        self._clf = Classifier.load(context.artifacts["checkpoint"], tokenizer_path=context.artifacts["tokenizer"])

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> pd.DataFrame:
        return predict_frame(self._clf, model_input, batch_size=int((params or {}).get("batch_size", 64)))


def predict_frame(clf: Classifier, frame, batch_size: int = 64):
    """Classify the rows of a DataFrame (the pyfunc's ``predict``)."""
    if not isinstance(frame, pd.DataFrame):
        frame = pd.DataFrame(frame if isinstance(frame, dict) else {clf.text_columns[0]: list(frame)})
    cols = clf.text_columns
    missing = [c for c in cols if c not in frame.columns]
    if missing and len(cols) == 1 and len(frame.columns) == 1:
        frame = frame.rename(columns={frame.columns[0]: cols[0]})
        missing = []
    if missing:
        raise BertraceError(
            f"model input: no column(s) {missing}; the model reads {cols}, the input has {list(frame.columns)}"
        )
    texts = [frame[c].fillna("").astype(str).tolist() for c in cols]
    inputs = texts[0] if len(cols) == 1 else list(zip(texts[0], texts[1]))
    out = clf.task.pyfunc_columns(clf, inputs, batch_size)  # e.g. label, label_id, prob_<name>; score; entities
    return pd.DataFrame(out, index=frame.index)


def pip_requirements() -> list[str]:
    """The pyfunc's runtime packages pinned to the installed versions (local tags like
    ``+cpu`` dropped: the index serves the plain version)."""
    reqs = []
    for name in ("torch", "tokenizers", "numpy", "pandas"):
        version = metadata.version(name).split("+")[0]
        reqs.append(f"{name}=={version}")
    return reqs


def _package_copy(dest: Path) -> Path:
    """A clean copy of the ``pipeline`` package (no caches) for the model's code_paths."""
    import pipeline

    src = Path(pipeline.__file__).resolve().parent
    target = dest / "pipeline"
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    return target


def log_pyfunc(
    model_pt: str | Path,
    artifact_path: str = "model",
    *,
    tokenizer_path: str | Path | None = None,
    registered_model_name: str | None = None,
    input_example: list[str] | None = None,
):
    """Log a fine-tuned checkpoint as an MLflow pyfunc model in the active run (MLflow opens one
    if none is active); returns MLflow's ``ModelInfo``. Load it back with
    ``mlflow.pyfunc.load_model(f"runs:/{run_id}/{artifact_path}")``."""
    import inspect

    import mlflow.pyfunc
    from mlflow.models import infer_signature

    path = Path(model_pt)
    clf = Classifier.load(path, tokenizer_path)
    tok = Path(tokenizer_path) if tokenizer_path else path.parent / "tokenizer.json"
    texts = input_example or PROBE_TEXTS[:2]
    example = pd.DataFrame({c: (texts if i == 0 else list(reversed(texts))) for i, c in enumerate(clf.text_columns)})
    with warnings.catch_warnings():  # "integer column can't hold missing values": label_id is never missing
        warnings.filterwarnings("ignore", message=".*integer column", category=UserWarning)
        signature = infer_signature(example, predict_frame(clf, example))
    with tempfile.TemporaryDirectory(prefix="bertrace-pyfunc-") as tmp:
        code = _package_copy(Path(tmp))
        kwargs: dict[str, Any] = dict(
            python_model=BertracePyfunc(),
            artifacts={"checkpoint": str(path), "tokenizer": str(tok)},
            code_paths=[str(code)],
            pip_requirements=pip_requirements(),
            signature=signature,
            input_example=example,
            registered_model_name=registered_model_name,
            metadata={
                "bertrace_checkpoint_sha256": sha256_file(path),
                "bertrace_tokenizer_sha256": clf.checkpoint["tokenizer_sha256"],
                "label_names": clf.label_names,
                "text_columns": clf.text_columns,
            },
        )
        if "name" in inspect.signature(mlflow.pyfunc.log_model).parameters:  # MLflow 3
            kwargs["name"] = artifact_path
        else:  # pragma: no cover - MLflow 2
            kwargs["artifact_path"] = artifact_path
        return mlflow.pyfunc.log_model(**kwargs)
