"""Serving engines run for real beside our decoder (vLLM's CPU build, in its own venv)."""
