"""Lamina's benchmark suite (run with ``lamina bench``); not an installed package."""
