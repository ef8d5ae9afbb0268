"""Know a run before it runs, on the driver: the dry run (``dry_run``), and the memory estimate of every worker
(``memory_estimate``: a model's terms; ``memory_phases``: the step's phases) checked before any model loads."""
