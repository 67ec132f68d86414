"""Hugging Face: import of published checkpoints, export per model family, the MLflow pyfunc model."""
