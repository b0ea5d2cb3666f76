"""Typed values: artifacts, tool results, the envelope and its layers, history, the library."""
