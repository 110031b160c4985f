"""flux-cluster from Python: the library under the CLI's submit, preflight, runs, status, logs, cancel,
requeue, sweep, report, prepare-data, data encode and evaluate commands (which are thin wrappers over
it), one module per group (runs, sweeps, reports, data, evaluation). Importing this package imports no
torch.

    from flux_cluster import api

    best = api.sweep("local", {"train.micro_batch_size": [1, 2, 4, 8]}, synthetic=True).best()
    run = api.submit("dgx_h100x8", overrides=["train.compile=true"])   # -> Run
    run.wait(); print(run.status(), run.logs()[-2000:])
    print(api.report([run.run_dir]).to_json())

Errors are flux_cluster.errors.FluxClusterError, one line each (the CLI prints them as 'error: ...');
report() finding no result logs is its subclass NoResultsError.
"""

from flux_cluster.api.data import DataRun, encode, prepare_data, synth_hf
from flux_cluster.api.evaluation import Evaluation, evaluate
from flux_cluster.api.forecast import forecast
from flux_cluster.api.reports import Report, report
from flux_cluster.api.runs import Run, list_runs, load_system, open_run, preflight, requeue, submit
from flux_cluster.api.sweeps import Sweep, open_sweep, plan_sweep, sweep
from flux_cluster.errors import FluxClusterError, NoResultsError

__all__ = [
    "DataRun",
    "Evaluation",
    "FluxClusterError",
    "NoResultsError",
    "Report",
    "Run",
    "Sweep",
    "encode",
    "evaluate",
    "forecast",
    "list_runs",
    "load_system",
    "open_run",
    "open_sweep",
    "plan_sweep",
    "preflight",
    "prepare_data",
    "report",
    "requeue",
    "submit",
    "sweep",
    "synth_hf",
]
