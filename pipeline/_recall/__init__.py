"""Recall: what the budget dropped stays findable and comes back when the query asks."""
