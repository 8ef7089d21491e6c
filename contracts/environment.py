"""Environment variables the supervisor sets for every process it starts (the code server, the
daemon, the workers and the runs they execute), read on the other side."""

API_URL_ENV = "SHOTLOOM_API_URL"  # where runs reach the API (re-renders) and link its media (previews)
