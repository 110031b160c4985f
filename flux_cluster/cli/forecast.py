"""flux-cluster forecast: time-to-train, GPU-hours and cost at N GPUs from what one node measured."""

from pathlib import Path
from typing import Annotated

import typer

from flux_cluster.cli.options import SetOption, SystemOption
from flux_cluster.cli.report import Format, RulesetChoice, emit_as
from flux_cluster.errors import FluxClusterError


def parse_points(values: list[str]) -> list[int | tuple[int, int]]:
    """--gpus values: N, N:BATCH, comma-separated or repeated; a bad one is one line."""
    points: list[int | tuple[int, int]] = []
    for item in (part.strip() for value in values for part in value.split(",")):
        gpus, _, batch = item.partition(":")
        try:
            points.append((int(gpus), int(batch)) if batch else int(gpus))
        except ValueError:
            raise FluxClusterError(f"--gpus {item!r}: expected N or N:BATCH (e.g. 64 or 512:2048)") from None
    return points


def parse_dp_shard(value: str | None) -> int | str | None:
    if value is None or value == "world":
        return value
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise FluxClusterError(f"--dp-shard {value!r}: expected a GPU count or 'world'")


GpusOption = Annotated[
    list[str] | None,
    typer.Option(help="GPU counts to forecast: N[,N...] or N:BATCH (repeatable).", metavar="N[:BATCH]"),
]
BatchOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        metavar="BATCH",
        help="Global batch for every --gpus N \\[default: the largest batch preset that splits over N "
        "and is at most N x the system's per-GPU batch].",
        show_default=False,
    ),
]
DpShardOption = Annotated[
    str | None,
    typer.Option(
        metavar="N|world",
        help="GPUs that shard one model copy, or 'world' (FSDP over all GPUs) \\[default: the system's "
        "train.dp_shard: one node].",
        show_default=False,
    ),
]
BandwidthOption = Annotated[
    float | None,
    typer.Option(
        metavar="GBPS",
        help="Measured bus bandwidth in GB/s of collectives within one scale-up domain (NVLink; nccl-tests "
        "busbw) \\[default: the system's interconnect.scale_up_gbps x 0.8].",
        show_default=False,
    ),
]
InterBandwidthOption = Annotated[
    float | None,
    typer.Option(
        metavar="GBPS",
        help="Measured bus bandwidth in GB/s of collectives across scale-up domains (the NICs) \\[default: "
        "interconnect.scale_out_gbps x 0.8 x the group's GPUs per domain].",
        show_default=False,
    ),
]


def forecast(
    sources: Annotated[
        list[Path],
        typer.Option(
            "--from",
            metavar="PATH",
            help="A throughput sweep (flux-cluster sweep --job throughput), MLPerf result folders or run "
            "directories (repeatable).",
        ),
    ],
    system: SystemOption,
    gpus: GpusOption = None,
    global_batch_size: BatchOption = None,
    target: Annotated[
        list[Path] | None,
        typer.Option(
            help="MLPerf result folders to forecast at their own GPUs and batch, beside their score."
        ),
    ] = None,
    ruleset: Annotated[
        RulesetChoice | None,
        typer.Option(
            help="RCP ruleset \\[default: the result logs', as report reads it; else the system's].",
            show_default=False,
        ),
    ] = None,
    dp_shard: DpShardOption = None,
    bandwidth: BandwidthOption = None,
    inter_bandwidth: InterBandwidthOption = None,
    price: Annotated[
        float | None,
        typer.Option(
            min=0, metavar="USD", help="USD per GPU-hour \\[default: the system's].", show_default=False
        ),
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(
            help="Minutes: name the cheapest point whose band ends within them.", show_default=False
        ),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Run the compliance checker on result logs.")
    ] = False,
    overrides: SetOption = None,
    output_format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (atomically) instead of stdout.")
    ] = None,
) -> None:
    """Forecast flux1 time-to-train (minutes, with a band), GPU-hours and cost at each --gpus count from a
    throughput sweep on one node, flux-cluster runs or published MLPerf results; --target compares the
    forecast with official scores. Each row says its basis (the model: README, 'Forecasts')."""
    from flux_cluster import api
    from flux_cluster.report.forecast import render

    if output is not None and output.is_dir():
        raise FluxClusterError(f"--output {output}: is a directory; give a file name")
    result = api.forecast(
        sources,
        system=system,
        gpus=parse_points(gpus or []),
        global_batch_size=global_batch_size,
        targets=target or [],
        ruleset=ruleset.value if ruleset else None,
        dp_shard=parse_dp_shard(dp_shard),  # type: ignore[arg-type]
        bandwidth=bandwidth,
        inter_bandwidth=inter_bandwidth,
        price=price,
        deadline=deadline,
        check=check,
        overrides=overrides or [],
    )
    renders = {
        Format.json: render.render_json,
        Format.csv: render.render_csv,
        Format.md: render.render_markdown,
        Format.html: render.render_html,
    }
    emit_as(
        output_format,
        output,
        lambda console: render.print_forecast(result, console),
        lambda: renders[output_format](result),
    )
