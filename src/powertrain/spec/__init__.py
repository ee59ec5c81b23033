"""Typed, validated descriptions of what to run: model, layout, knobs, hardware, protocol."""
