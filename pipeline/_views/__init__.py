"""Forms of an artifact: full, preview, summary, excerpt, reference."""
