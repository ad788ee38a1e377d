"""Mechanisms: which solution a model found and which positions, variables and edges carry it."""
