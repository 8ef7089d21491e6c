"""HTTP layer (FastAPI): the R2V scheduler and OpenAI-compatible contracts, talking to Dagster over GraphQL.

Not built yet (issue #4); kept here so the layer boundaries are visible.
"""
