"""Untrusted input: confined non-blocking file reads, bounded YAML/JSON, argument checks."""
