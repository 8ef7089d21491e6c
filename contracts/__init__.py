"""What crosses a process, typed: the API, the daemon, the workers and the ops all import these.

``runs``    the run configs of the code location's jobs (the API builds them, the ops read them)
``worker``  a worker's HTTP protocol: its status, the run offer and the answers
``tags``    every run tag (the one place their keys are spelled) and the tags a job's runs carry
``events``  a run's stages and progress as hidden tags and run-event metadata, both ways

Nothing here imports the API, orchestration, the ops or torch: both sides of a wire can import it.
"""
