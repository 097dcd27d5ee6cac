"""The OpenAI-compatible endpoint for external agents (`streamrl serve`)."""
