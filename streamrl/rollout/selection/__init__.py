"""Prompt selection: which items to generate, and how a group is drawn."""
