"""Applications of a trained model: the demo page and text generation."""
