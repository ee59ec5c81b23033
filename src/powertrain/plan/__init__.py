"""Sweeps: specs with grids, expansion, validation before launch, and sweep state on disk."""
