"""The public HTTP contract: pydantic request/response models and the committed openapi.json."""
