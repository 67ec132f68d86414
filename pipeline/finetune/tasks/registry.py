"""The fine-tuning task types by name: ``finetune.task.type`` in params.yaml names one of them (one
class per file of this package; ``base.py`` is the interface). A new type is a file and a
:func:`register` line here (or a ``register`` call before the task is loaded)."""

from __future__ import annotations

from pipeline.core.errors import BertraceError
from pipeline.finetune.tasks.base import TaskType
from pipeline.finetune.tasks.classification import Classification
from pipeline.finetune.tasks.regression import Regression
from pipeline.finetune.tasks.token_classification import TokenClassification

TASK_TYPES: dict[str, TaskType] = {}


def register(task: TaskType) -> TaskType:
    """Add ``task`` (an instance) under its ``name``; a name registered already is an error."""
    if task.name in TASK_TYPES:
        raise ValueError(f"task type {task.name!r} is registered already")
    TASK_TYPES[task.name] = task
    return task


def unregister(name: str) -> None:
    """Remove the task type ``name`` (tests that register their own)."""
    TASK_TYPES.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered task types, in registration order."""
    return tuple(TASK_TYPES)


def choices() -> str:
    """``'a', 'b' or 'c'``: the registered names as a message lists them."""
    quoted = [repr(n) for n in TASK_TYPES]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def get(name: str) -> TaskType:
    """The task type ``name``; BertraceError listing the registered ones for another name."""
    task = TASK_TYPES.get(name)
    if task is None:
        raise BertraceError(
            f"params.yaml: finetune.task.type = {name!r}: input should be {choices()}; fix it in params.yaml"
        )
    return task


register(Classification())
register(TokenClassification())
register(Regression())

__all__ = ["TASK_TYPES", "choices", "get", "names", "register", "unregister"]
