"""flux-cluster forecast against published MLPerf v5.1 flux1 scores: each family forecast from its
smallest one or two scales, and across clusters with the same GPU; prints the Markdown table
docs/benchmarks.md carries (forecast, band, official score, error, whether the band holds it).

    .venv/bin/python benchmarks/forecast_validation.py [mlperf_v51_scaling.tar.gz]

The archive: ../shared/data/mlperf_v51_scaling.tar.gz (real v5.1 result folders; the official scores in
its README). NVIDIA's NeMo implementation (which these submitters ran) shards the optimizer state and
gradients over every data-parallel rank: the forecasts say so with --dp-shard world.
"""

import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

from flux_cluster import api

ARCHIVE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mlperf_v51_scaling.tar.gz"
UF = "University-of-Florida/results/hpg.dgxb200x8.n{}/flux1"
TYCHE = "NVIDIA/results/tyche_ngpu{}_ngc25.09_nemo/flux1"
NEBIUS = "Nebius/results/nebius_b200_n4/flux1"
ALL_UF = [UF.format(n) for n in (2, 4, 8, 9, 16)]
CASES = [
    ("B200 from UF 16 GPUs", "dgx_b200x8", [UF.format(2)], [UF.format(n) for n in (4, 8, 9, 16)] + [NEBIUS]),
    ("B200 from UF 16+32", "dgx_b200x8", [UF.format(2), UF.format(4)], [UF.format(n) for n in (8, 9, 16)]),
    ("B200 from Nebius 32 (another cluster)", "dgx_b200x8", [NEBIUS], ALL_UF),
    ("GB200 from tyche 16+72", "gb200_nvl72", [TYCHE.format(16), TYCHE.format(72)], [TYCHE.format(512)]),
    ("GB200 from tyche 16", "gb200_nvl72", [TYCHE.format(16)], [TYCHE.format(72), TYCHE.format(512)]),
]


def main(archive: Path) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        root = Path(tmp)
        lines = [
            "| forecast from | system | target | GPUs | batch | per GPU | forecast min | band | official "
            "| error | in band | band width |",
            "|---|---|---|---:|---:|---:|---:|---|---:|---:|---|---:|",
        ]
        errors, widths, inside = [], [], []
        for name, system, sources, targets in CASES:
            result = api.forecast(
                [root / s for s in sources],
                system=system,
                targets=[root / t for t in targets],
                ruleset="5.1.0",
                dp_shard="world",
            )
            for row in result.rows:
                assert row.target is not None and row.actual_minutes is not None and row.error is not None
                width = max(row.minutes_high / row.minutes - 1, 1 - row.minutes_low / row.minutes)
                errors.append(abs(row.error))
                widths.append(width)
                inside.append(bool(row.inside))
                label = Path(row.target).parent.name
                lines.append(
                    f"| {name} | {system} | {label} | {row.gpus} | {row.global_batch_size} | "
                    f"{row.per_gpu_batch:g} | {row.minutes:.2f} | "
                    f"{row.minutes_low:.2f}..{row.minutes_high:.2f} "
                    f"| {row.actual_minutes:.2f} | {row.error:+.1%} | {'yes' if row.inside else 'NO'} | "
                    f"+-{width:.0%} |"
                )
        print("\n".join(lines))
        print(
            f"\n{len(errors)} forecasts: median error {statistics.median(errors):.1%}, "
            f"worst {max(errors):.1%}; {sum(inside)} of {len(inside)} official scores inside their band; "
            f"widest band +-{max(widths):.0%}."
        )
    return 0 if all(inside) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ARCHIVE))
