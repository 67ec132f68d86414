"""bertrace: a reproducible BERT pre-training and fine-tuning pipeline.

The library half: every module here is logic without CLI or global state, in subpackages that
follow the DAG (README "Tests and layout"). DVC stage entry points live in ``stages/``.
"""
