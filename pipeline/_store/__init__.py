"""Persistence: the SQLite store and transcripts."""
