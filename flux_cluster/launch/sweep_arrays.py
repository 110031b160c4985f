"""A sweep on Slurm: the points that ask for the same allocation go out as one array, throttled to
--max-parallel and waiting (afterany) for the arrays queued before them."""

import os
import time
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.sweep_plan import point_request
from flux_cluster.launch.sweep_status import reset
from flux_cluster.sweepdir import Point, SweepState

if TYPE_CHECKING:
    from rich.console import Console

    from flux_cluster.launch.plan import JobPlan


ARRAYS_DIR = "arrays"
"""The sweep's Slurm arrays: <stamp>-nodes<N>/ with the array's script and Slurm's output files."""

ARRAY_SCRIPT = "array.sh"


def queue_points(
    folder: Path, state: SweepState, todo: list[Point], console: "Console", dependency: str | None
) -> SweepState:
    """Write every point's run directory, then submit the points that ask for the same allocation as one
    array. With --max-parallel N each array runs at most N tasks at once (%N), and an array waits
    (afterany) for the oldest arrays queued before it (those of an earlier submission included) only as
    far as needed to keep at most N points running: arrays that fit in N together run side by side. A
    point that cannot be prepared, or whose array sbatch refused, is failed with the reason and takes no
    place in the window."""
    from flux_cluster.launch.render import allocation
    from flux_cluster.launch.submit import plan_launch, remove_unstarted, write_run

    window = state.max_parallel
    # (array id, how many of its tasks may run at once), oldest first: what a new array may have to wait for
    running: list[tuple[str, int]] = []
    for point in state.points:
        if point.status == "running" and point.job_ids:
            running.append((_base_id(point), 1))
    in_slurm = _merge_counts(running, window)
    groups: dict[tuple[str, ...], list[tuple[Point, JobPlan]]] = {}
    for point in todo:
        reset(point)
        try:
            plan, training = plan_launch(point_request(folder, state, point), console)
        except FluxClusterError as exc:  # e.g. a data root missing: the others still go
            point.status, point.error = "failed", str(exc)
            continue
        try:
            write_run(plan, training)
        except FluxClusterError as exc:
            remove_unstarted(plan.run_dir)
            point.status, point.error = "failed", str(exc)
            continue
        point.run_dir, point.launcher = str(plan.run_dir), "slurm"
        groups.setdefault(allocation(plan), []).append((point, plan))
    state.save(folder)
    arrays = 0
    for group in groups.values():
        width = min(len(group), window) if window else len(group)
        before = list(in_slurm)
        waits = make_room(in_slurm, width, window)
        after = ["afterany:" + ":".join(waits)] if waits else []
        if dependency:  # last: slurmctld reads a bare JOBID and what follows it as JOBID,JOBID,... only
            after.append(dependency)
        base_id = _submit_array(folder, state, group, ",".join(after) or None, console)
        if base_id is None:  # refused: it takes no place, and what it would have waited for still runs
            in_slurm[:] = before
        else:
            in_slurm.append((base_id, width))
            arrays += 1
        state.save(folder)
    queued = sum(1 for p in todo if p.job_ids)
    limit = f", at most {window} at once" if window else ""
    refused = f"; {len(todo) - queued} failed to queue (see runs_summary.csv)" if queued < len(todo) else ""
    console.print(
        f"sweep {state.name}: {queued} points queued as {arrays} Slurm array(s){limit}{refused}; follow "
        f"it: flux-cluster sweep --resume {folder} --wait, or flux-cluster report {folder}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return state


def _submit_array(
    folder: Path,
    state: SweepState,
    group: "list[tuple[Point, JobPlan]]",
    dependency: str | None,
    console: "Console",
) -> str | None:
    """sbatch one array for the group's points (task i: the i-th point); its task ids go to each point's
    jobs.json, and each point's slurm/ links to its task's output. Returns the array's id, or None when
    sbatch refused it (its points failed, with the reason; their run folders and the array's removed)."""
    from flux_cluster.atomic import write_atomic
    from flux_cluster.launch import slurm
    from flux_cluster.launch.plan import ArrayPlan
    from flux_cluster.launch.render import render_array
    from flux_cluster.launch.submit import remove_unstarted, warn_if_image_missing
    from flux_cluster.rundir import RunRecord, create_run_dir

    first = group[0][1]
    plan = ArrayPlan(
        first=first,
        run_dirs=tuple(p.run_dir for _, p in group),
        folder=create_run_dir(folder, ARRAYS_DIR, f"nodes{first.system.nodes}"),
        name=state.name,
        throttle=state.max_parallel,
        dependency=dependency,
    )
    script = render_array(plan)
    write_atomic(plan.folder / ARRAY_SCRIPT, script, mode=0o755)
    plan.slurm_dir.mkdir(exist_ok=True)  # Slurm opens --output there before the script starts
    warn_if_image_missing(first.system, console)
    try:
        base_id = slurm.submit_script(script, plan.slurm_dir)
    except FluxClusterError as exc:  # nothing started: none of its folders stays (--resume makes new ones)
        for point, point_plan in group:
            remove_unstarted(point_plan.run_dir)
            point.status, point.error, point.run_dir, point.launcher = "failed", str(exc), None, None
        remove_unstarted(plan.folder)
        with suppress(OSError):  # arrays/ itself, if this was its first
            plan.folder.parent.rmdir()
        return None
    submitted = time.time()
    for task, (point, _) in enumerate(group):  # recorded at once: a --resume must never queue them again
        point.job_ids, point.status = [f"{base_id}_{task}"], "running"
    state.save(folder)
    for point, point_plan in group:
        (job_id,) = point.job_ids
        RunRecord(launcher="slurm", job_ids=[job_id], submitted_at=submitted).save(point_plan.run_dir)
        for stream in (False, True):  # the task's output, where 'flux-cluster logs RUN' looks for it
            target = slurm.log_path(job_id, plan.slurm_dir, stream)
            link = slurm.log_path(job_id, point_plan.slurm_dir, stream)
            with suppress(FileExistsError):
                link.symlink_to(os.path.relpath(target, link.parent))
    throttle = f", {plan.throttle} at a time" if plan.throttle else ""
    after = f", after {dependency}" if dependency else ""
    console.print(
        f"submitted array {base_id} ({len(group)} points on {first.system.nodes} node(s){throttle}{after}): "
        f"{plan.folder}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return base_id


def make_room(in_slurm: list[tuple[str, int]], width: int, window: int | None) -> list[str]:
    """The arrays (oldest first, taken out of in_slurm) that a new array running width tasks at once must
    wait for, so that no more than window points run together; none without a window."""
    waits = []
    while window and in_slurm and sum(n for _, n in in_slurm) + width > window:
        waits.append(in_slurm.pop(0)[0])
    return waits


def _merge_counts(tasks: list[tuple[str, int]], window: int | None) -> list[tuple[str, int]]:
    """(array id, tasks) summed per array in first-seen order, each at most the window (its %N)."""
    counts: dict[str, int] = {}
    for array, n in tasks:
        counts[array] = counts.get(array, 0) + n
    return [(array, min(n, window) if window else n) for array, n in counts.items()]


def _base_id(point: Point) -> str:
    """The job id a dependency names: an array's base id, so it waits for every task."""
    return point.job_ids[0].split("_")[0]
