"""bertrace: a reproducible BERT pre-training and fine-tuning pipeline.

The library half: every module here is logic without CLI or global state.
DVC stage entry points live in ``stages/``.
"""

__version__ = "0.1.0"
