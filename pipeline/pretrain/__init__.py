"""Pre-training: the loop, its data loader, checkpoints, skip-gram embedding init, the objectives."""
