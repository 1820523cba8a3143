"""The model: loading a checkpoint, and running its encoder and decoder for many requests."""
