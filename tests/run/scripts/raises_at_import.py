"""Raises while it is imported, before any training."""

print("starting")
raise RuntimeError("no data here")
