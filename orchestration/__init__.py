"""Dagster definitions: jobs, assets, resources (and later the launcher and device worker)."""
