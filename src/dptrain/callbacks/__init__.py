"""Callbacks: hooks into a run (see base.py)."""
