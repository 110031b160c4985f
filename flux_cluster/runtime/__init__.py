"""Rank-side support every job uses: signals and requeue, process-group start-up, exit codes, job files.

It never imports the launcher side (launch/, cli/, api, report/); importing it stays cheap (no torch)."""
