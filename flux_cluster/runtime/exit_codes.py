"""Exit codes a job's ranks end with that mean more than 'failed' (the job script and the launcher read
them)."""

NOT_CONVERGED_EXIT_CODE = 3
"""Exit code of a pretraining run whose sample budget ran out before the quality target (run_stop
'aborted'). Fine-tuning runs train for their budget and end normally there."""

INTERRUPTED_EXIT_CODE = 75
"""Exit code of an interrupted run outside Slurm, where nothing requeues it (EX_TEMPFAIL)."""
