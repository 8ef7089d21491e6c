"""The OpenAI-compatible video dialect (``/v1``): protocol models, serving, router, one error envelope."""
