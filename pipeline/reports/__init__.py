"""What is rendered from the stages' outputs: the scorecard, plots, the learning curve, profiles."""
