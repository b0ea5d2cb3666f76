"""Conversations across turns: the Conversation, its invariants, agent loops."""
