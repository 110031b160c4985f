"""flux-cluster report: MLPerf result logs -> time-to-train, throughput, GPU-hours, cost, plots.

``build`` runs the whole harvest: find the groups (``discover``), stream every log once
(``harvest``), run the official compliance checker in worker processes (``compliance``), and score
each group as MLPerf's result_summarizer does (``scoring``), with a run directory's ``flux-cluster evaluate``
results (``evaluation``). ``formats`` and ``html`` present it.
"""
