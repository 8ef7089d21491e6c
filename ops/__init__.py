"""Typed Dagster ops: conditioning, denoise, decode, write, merge."""
