"""Fine-tuning: the loop, task data for classification, regression and token classification, task metrics."""
