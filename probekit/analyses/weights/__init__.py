"""Weights alone: condensation of neurons, spectra, embedding geometry."""
