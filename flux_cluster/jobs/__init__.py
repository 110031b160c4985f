"""Every ``python -m`` entry point a job script runs on the ranks (train, preflight, throughput, evaluate,
model_check, local_launch, the signal relay, data, the compliance step). The launcher names them in
flux_cluster/launch/plan.py; nothing here imports the launcher side (launch/, cli/, api, report/).
Importing this package stays cheap."""
