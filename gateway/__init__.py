"""The HTTP gateway (FastAPI, OpenAI-compatible). Never imports torch."""
