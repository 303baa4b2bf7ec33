"""Routers, one per concern: plans, dry runs, presets, operations."""
