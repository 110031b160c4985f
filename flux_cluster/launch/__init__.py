"""Launching jobs: plan (what a job needs), render (the job script), rundir (run directories), submit
(launch one job), local_runner and slurm (where it runs), track (its state, logs, cancel), sweep (grids of
runs), data_jobs (data preparation as Slurm jobs). No torch is imported here."""
