"""Launching jobs: plan (what a job needs, and a sweep array's plan), render (the job script), rundir (run
directories), submit (launch one job; launch_plan, the one way every planned job starts), local_runner and
slurm (where it runs), track (its state, logs, waiting, cancel), sweep (grids of runs, on Slurm as arrays),
data_jobs and evaluate_jobs (data preparation and evaluation as Slurm jobs). No torch is imported here."""
