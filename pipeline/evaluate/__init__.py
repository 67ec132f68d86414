"""Evaluation: the report of a fine-tuned model on its task's splits, and inference."""
