"""HTTP layer (FastAPI): the R2V scheduler contract, talking to Dagster only over GraphQL.

``python -m api --config <server YAML>`` serves it; server.py starts it with the rest of the
service. Nothing here imports torch.
"""
