"""The stage runner and the built-in stages (expand, dedup, reference, promote)."""
