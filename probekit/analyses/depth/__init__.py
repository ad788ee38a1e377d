"""Depth use: how much each layer contributes, what skipping or swapping layers does."""
