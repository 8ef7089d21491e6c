"""The dialect-neutral job service: specs, intake, errors. No HTTP types, no status codes."""
