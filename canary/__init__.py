"""Canary: iterative dataflow programs whose workers schedule their own tasks."""
