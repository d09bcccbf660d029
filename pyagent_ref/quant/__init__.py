"""Quantized checkpoints."""
