"""prepare-data end to end on synthetic tiny-dims data (synth, convert, index, verify) through the CLI."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.data.format import DIMS, decode_tensor, from_bf16_bits, to_bf16_bits

FLUX = [sys.executable, "-m", "flux_cluster"]


def run_cli(cli: CliRunner, *args: str) -> tuple[int, str]:
    result = cli.invoke(app, list(args))
    return result.exit_code, result.output


def shard_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.glob("*/shard_*.tar"))
    }


def source_rows(path: Path) -> dict[str, dict[str, bytes]]:
    rows: dict[str, dict[str, bytes]] = {}
    for file in sorted(path.glob("*.arrow")):
        with pa.memory_map(str(file)) as mapped:
            for row in pa.ipc.open_stream(mapped).read_all().to_pylist():
                rows[row["__key__"]] = row
    return rows


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "src"
    code, output = run_cli(
        CliRunner(), "data", "synth", str(out), "--train", "90", "--val", "20", "--seed", "3"
    )
    assert code == 0, output
    return out


@pytest.fixture(scope="module")
def energon_root(synthetic: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("energon") / "root"
    code, output = run_cli(
        CliRunner(),
        "prepare-data",
        "--system",
        "local",
        "--input",
        str(synthetic),
        "--output",
        str(root),
        "--shard-size",
        "25",
        "--workers",
        "2",
    )
    assert code == 0, output
    assert "verify: all checks passed" in output
    return root


def test_bf16_encoding_rounds_like_torch() -> None:
    import torch

    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 100
    ours = to_bf16_bits(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.uint16).numpy()
    assert np.array_equal(ours, theirs)
    assert np.allclose(from_bf16_bits(ours), values, rtol=1e-2)


def test_layout_matches_nvidia(energon_root: Path) -> None:
    assert sorted(p.name for p in (energon_root / "train").glob("*.tar")) == [
        f"shard_{i:06d}.tar" for i in range(4)
    ]
    assert (energon_root / "train" / "index.txt").read_text().split() == [
        f"shard_{i:06d}.tar" for i in range(4)
    ]
    assert (energon_root / "val" / "index.txt").read_text().split() == ["shard_000000.tar"]
    assert {p.name for p in (energon_root / "empty_encodings").iterdir()} == {
        "t5_empty.npy",
        "clip_empty.npy",
    }
    meta = energon_root / ".nv-meta"
    assert "CrudeWebdataset" in (meta / "dataset.yaml").read_text()
    split = (meta / "split.yaml").read_text()
    assert "train/shard_" in split and "val/shard_000000.tar" in split
    with tarfile.open(energon_root / "train" / "shard_000000.tar") as archive:
        names = archive.getnames()
    assert names[:5] == [
        "00000000.json",
        "00000000.clip.bytes",
        "00000000.logvar.bytes",
        "00000000.mean.bytes",
        "00000000.t5.bytes",
    ]
    assert len(names) == 25 * 5


def test_shard_members_are_the_source_bytes(synthetic: Path, energon_root: Path) -> None:
    columns = {
        "t5.bytes": "t5_encodings",
        "clip.bytes": "clip_encodings",
        "mean.bytes": "mean",
        "logvar.bytes": "logvar",
    }
    for split, folder, shards in (("train", "cc12m_preprocessed", 4), ("val", "coco_preprocessed", 1)):
        rows = source_rows(synthetic / folder)
        seen = 0
        for shard in range(shards):
            with tarfile.open(energon_root / split / f"shard_{shard:06d}.tar") as archive:
                members = {m.name: archive.extractfile(m).read() for m in archive}
            for name, data in members.items():
                if not name.endswith(".json"):
                    continue
                record = json.loads(data)
                stem = name.removesuffix(".json")
                row = rows[record["key"]]
                for suffix, column in columns.items():
                    assert members[f"{stem}.{suffix}"] == row[column]
                assert record.get("timestep") == row.get("timestep")
                seen += 1
        assert seen == len(rows)
    # val sample names continue after train's: Energon refuses a key used twice
    with tarfile.open(energon_root / "val" / "shard_000000.tar") as archive:
        assert archive.getnames()[0] == "00000090.json"


def test_arrow_and_parquet_sources_give_identical_shards(
    energon_root: Path, tmp_path: Path, cli: CliRunner
) -> None:
    source = tmp_path / "parquet-src"
    code, output = run_cli(
        cli,
        "data",
        "synth",
        str(source),
        "--train",
        "90",
        "--val",
        "20",
        "--seed",
        "3",
        "--format",
        "parquet",
    )
    assert code == 0, output
    assert list((source / "cc12m_preprocessed").glob("*.parquet"))
    root = tmp_path / "out"
    code, output = run_cli(
        cli,
        "prepare-data",
        "--input",
        str(source),
        "--output",
        str(root),
        "--stage",
        "convert",
        "--shard-size",
        "25",
    )
    assert code == 0, output
    assert shard_hashes(root) == shard_hashes(energon_root)


def test_synthetic_latents_follow_the_text_encodings(synthetic: Path) -> None:
    """Learnable: a least-squares fit from CLIP to the per-channel latent mean explains most variance."""
    rows = list(source_rows(synthetic / "cc12m_preprocessed").values())
    dims = DIMS["tiny"]
    clip = np.stack([from_bf16_bits(decode_tensor(r["clip_encodings"], (dims.clip_dim,))) for r in rows])
    latent = np.stack([from_bf16_bits(decode_tensor(r["mean"])).mean(axis=(1, 2)) for r in rows])
    design = np.c_[clip, np.ones(len(rows))]
    fit, *_ = np.linalg.lstsq(design, latent, rcond=None)
    residual = latent - design @ fit
    assert residual.var() < 0.05 * latent.var()


def test_rerun_skips_finished_shards(
    synthetic: Path, energon_root: Path, tmp_path: Path, cli: CliRunner
) -> None:
    """Same data through another path, no --shard-size (the recorded 25 is kept): nothing is redone."""
    before = {p: p.stat().st_mtime_ns for p in energon_root.glob("*/shard_*.tar")}
    (tmp_path / "link").symlink_to(synthetic)
    args = [
        "prepare-data",
        "--input",
        str(tmp_path / "link"),
        "--output",
        str(energon_root),
        "--stage",
        "convert",
    ]
    code, output = run_cli(cli, *args)
    assert code == 0, output
    assert "already done" in output
    assert {p: p.stat().st_mtime_ns for p in energon_root.glob("*/shard_*.tar")} == before


def test_changed_source_data_is_refused(energon_root: Path, tmp_path: Path, cli: CliRunner) -> None:
    other = tmp_path / "other"
    assert run_cli(cli, "data", "synth", str(other), "--train", "90", "--val", "20", "--seed", "4")[0] == 0
    code, output = run_cli(cli, "prepare-data", "--input", str(other), "--output", str(energon_root))
    assert code == 2 and "holds a conversion of other data" in output


def test_kill_during_convert_then_rerun_gives_identical_shards(tmp_path: Path, cli: CliRunner) -> None:
    source = tmp_path / "src"
    assert run_cli(cli, "data", "synth", str(source), "--train", "2000", "--val", "16")[0] == 0
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    args = [
        "prepare-data",
        "--input",
        str(source),
        "--stage",
        "convert",
        "--shard-size",
        "50",
        "--workers",
        "1",
    ]
    assert run_cli(cli, *args, "--output", str(clean))[0] == 0
    process = subprocess.Popen([*FLUX, *args, "--output", str(killed)], stderr=subprocess.DEVNULL)
    records = killed / ".flux-prep" / "train"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(records.glob("*.json"))) < 3:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = len(list(records.glob("*.json")))
    assert 3 <= finished < 40, "the kill must land in the middle of the conversion"
    code, output = run_cli(cli, *args, "--output", str(killed))
    assert code == 0, output
    assert "already done" in output
    assert shard_hashes(killed) == shard_hashes(clean)
    assert not list(killed.glob("*/.shard_*.partial-*"))


def test_verify_names_truncated_and_corrupt_shards(
    energon_root: Path, tmp_path: Path, cli: CliRunner
) -> None:
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(energon_root, root)
    truncated = root / "train" / "shard_000001.tar"
    truncated.write_bytes(truncated.read_bytes()[:150_000])
    # Corrupt one npy header inside shard 2: the member's bytes no longer parse.
    corrupt = root / "train" / "shard_000002.tar"
    data = bytearray(corrupt.read_bytes())
    with tarfile.open(corrupt) as archive:
        member = archive.getmember("00000050.mean.bytes")
    data[member.offset_data : member.offset_data + 6] = b"garbag"
    corrupt.write_bytes(bytes(data))
    code, output = run_cli(cli, "prepare-data", "--output", str(root), "--stage", "verify")
    assert code == 1
    assert f"{truncated}: truncated or corrupt tar" in output
    assert f"{corrupt}: member 00000050.mean.bytes: not an .npy payload" in output
    assert "FAILED" in output


def test_verify_checks_mlcommons_totals_and_real_shapes(
    energon_root: Path, tmp_path: Path, cli: CliRunner
) -> None:
    import shutil

    root = tmp_path / "as-mlcommons"
    shutil.copytree(energon_root, root)
    plan_path = root / ".flux-prep" / "plan.json"
    plan = json.loads(plan_path.read_text())
    plan_path.write_text(json.dumps({**plan, "source_kind": "mlcommons", "dims": "real"}))
    code, output = run_cli(cli, "prepare-data", "--output", str(root), "--stage", "verify")
    assert code == 1
    assert "the MLCommons train set has 1,099,776" in output
    assert "the MLCommons val set has 29,696" in output or "MLCommons val has 3712 each" in output
    assert "shape [16, 16, 16], expected [16, 32, 32]" in output


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("missing-dir", "coco_preprocessed: missing"),
        ("missing-column", "column 'mean' is missing"),
        ("truncated-arrow", "not a readable arrow file"),
    ],
)
def test_bad_input_gives_one_line_error(
    synthetic: Path, tmp_path: Path, cli: CliRunner, damage: str, expected: str
) -> None:
    import shutil

    source = tmp_path / "src"
    shutil.copytree(synthetic, source)
    if damage == "missing-dir":
        shutil.rmtree(source / "coco_preprocessed")
    elif damage == "missing-column":
        shutil.rmtree(source / "cc12m_preprocessed")
        (source / "cc12m_preprocessed").mkdir()
        table = pa.table(
            {"__key__": ["a"], "t5_encodings": [b"x"], "clip_encodings": [b"x"], "logvar": [b"x"]}
        )
        pq.write_table(table, source / "cc12m_preprocessed" / "part-0.parquet")
    else:
        arrow = next((source / "cc12m_preprocessed").glob("*.arrow"))
        arrow.write_bytes(arrow.read_bytes()[:5000])
    output_root = tmp_path / "out"
    result = subprocess.run(
        [*FLUX, "prepare-data", "--input", str(source), "--output", str(output_root)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert not list(output_root.glob("*/shard_*.tar"))


def test_unwritable_output_and_other_plans_are_refused(
    synthetic: Path, energon_root: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = subprocess.run(
        [*FLUX, "prepare-data", "--input", str(synthetic), "--output", str(blocker / "root")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "cannot write the output" in result.stderr, result.stderr
    result = subprocess.run(
        [
            *FLUX,
            "prepare-data",
            "--input",
            str(synthetic),
            "--output",
            str(energon_root),
            "--shard-size",
            "10",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "shard size 25" in result.stderr and "use another --output" in result.stderr


def test_data_info_describes_both_kinds_of_folder(
    synthetic: Path, energon_root: Path, cli: CliRunner
) -> None:
    code, output = run_cli(cli, "data", "info", str(energon_root))
    assert code == 0, output
    assert "indexed for Energon: yes" in output
    train_row = next(line for line in output.splitlines() if "train" in line)
    assert "4" in train_row and "90" in train_row
    code, output = run_cli(cli, "data", "info", str(energon_root), "--load", "3")
    assert code == 0, output
    assert "train loader: 12 samples" in output and "t5 [16, 32]" in output and "mean [16, 16, 16]" in output
    assert "val loader: 20 samples in one pass" in output
    code, output = run_cli(cli, "data", "info", str(synthetic))
    assert code == 0 and "cc12m_preprocessed" in output and "arrow" in output
    code, output = run_cli(cli, "data", "info", str(synthetic / "nowhere"))
    assert code == 2 and "no such directory" in output


def test_synth_refuses_to_overwrite(synthetic: Path, cli: CliRunner) -> None:
    code, output = run_cli(cli, "data", "synth", str(synthetic), "--train", "2", "--val", "2")
    assert code == 2 and "already holds" in output and "--force" in output


def test_download_is_resumable_with_a_stand_in_downloader(
    tmp_path: Path, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real downloader needs the internet; a stand-in checks the command and the resume logic."""
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "downloader.sh"
    fake.write_text(
        "#!/bin/bash\n"
        f'echo "$PWD $*" >> {calls}\n'
        'case "$1" in *coco*) [[ -e fail-coco ]] && exit 3; mkdir -p coco_preprocessed;;\n'
        "  *cc12m*) mkdir -p cc12m_preprocessed;; *empty*) mkdir -p empty_encodings;; esac\n"
    )
    monkeypatch.setenv("FLUX_R2_DOWNLOADER", str(fake))
    source = tmp_path / "download"
    source.mkdir()
    (source / "fail-coco").touch()
    args = ["prepare-data", "--stage", "download", "--set", f"paths.source_root={source}"]
    code, output = run_cli(cli, *args)
    assert code == 2 and "download of coco_preprocessed" in output and "exit code 3" in output
    (source / "fail-coco").unlink()
    code, output = run_cli(cli, *args)
    assert code == 0, output
    lines = calls.read_text().splitlines()
    assert (
        lines[0] == f"{source} https://training.mlcommons-storage.org/metadata/flux-1-cc12m-preprocessed.uri"
    )
    assert [line.rsplit("/", 1)[1] for line in lines] == [
        "flux-1-cc12m-preprocessed.uri",
        "flux-1-coco-preprocessed.uri",  # failed
        "flux-1-coco-preprocessed.uri",  # resumed: cc12m was not fetched again
        "flux-1-empty-encodings.uri",
    ]
    code, output = run_cli(cli, *args)
    assert code == 0 and "already downloaded" in output


def test_stage_and_launcher_mistakes_are_one_line_errors(synthetic: Path, cli: CliRunner) -> None:
    code, output = run_cli(cli, "prepare-data", "--stage", "download", "--input", str(synthetic))
    assert code == 2 and "nothing to download" in output
    code, output = run_cli(cli, "prepare-data", "--stage", "shuffle")
    assert code == 2 and "expected one of download, convert, index, verify or all" in output
    code, output = run_cli(cli, "prepare-data", "--submit", "--input", str(synthetic), "--output", "x")
    assert code == 2 and "drop --submit" in output
    code, output = run_cli(cli, "prepare-data", "--stage", "convert", "--input", str(synthetic))
    assert code == 2 and "no Energon root; pass --output" in output


def test_the_api_plans_prepare_data_and_keeps_submit_options_to_a_submitted_encode(
    synthetic: Path, tmp_path: Path
) -> None:
    from flux_cluster import api
    from flux_cluster.errors import FluxClusterError

    root = tmp_path / "root"
    done = api.prepare_data("local", "convert", source=synthetic, output=root, dry_run=True, workers=3)
    assert done.jobs == [] and done.ok and not root.exists()
    assert done.planned == [
        f"convert: source {synthetic.absolute()} -> output {root.absolute()}, 3 worker(s), shard size 10000"
    ]
    images = tmp_path / "images"
    with pytest.raises(FluxClusterError, match=r"^system, runs_dir: only with submit=True \(a local encode"):
        api.encode(images, tmp_path / "out", tmp_path / "model", system="local", runs_dir=tmp_path)
    with pytest.raises(FluxClusterError, match="inside the image folder"):
        api.encode(images, images / "out", tmp_path / "model")


def test_submit_dry_run_prints_chained_scripts(workdir: Path, cli: CliRunner) -> None:
    code, output = run_cli(
        cli,
        "prepare-data",
        "--system",
        "dgx_h100x8",
        "--submit",
        "--dry-run",
        "--input",
        "/site/download",
        "--output",
        "/site/energon",
    )
    assert code == 0, output
    stages = [line.split()[3].rstrip(":") for line in output.splitlines() if line.startswith("# ---- stage")]
    assert stages == ["convert", "index", "verify"]
    assert "sbatch --dependency=afterok:<job id of the stage before>" in output
    assert output.count("#!/bin/bash") == 3
    assert "--stage convert" in output and "#SBATCH --array=0-7" in output
    assert "/site/energon:/data,/site/download:/source" in output
    assert not Path("/site").exists()
    assert len(list((workdir / "runs" / "prepare-data").iterdir())) == 3


def test_cli_help_stays_light() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from flux_cluster.cli import app; "
            "print(sorted(m for m in ('torch', 'pyarrow', 'megatron') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    )
    assert result.stdout.strip() == "[]"


def test_concurrent_converts_of_one_output_agree(synthetic: Path, energon_root: Path, tmp_path: Path) -> None:
    """Two runs on the same output at once (a resubmitted array, a local run beside a Slurm one)."""
    root = tmp_path / "shared"
    args = [*FLUX, "prepare-data", "--input", str(synthetic), "--output", str(root), "--stage", "convert"]
    runs = [
        subprocess.Popen(
            [*args, "--shard-size", "25", "--workers", str(w)], stderr=subprocess.PIPE, text=True
        )
        for w in (1, 2)
    ]
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    assert shard_hashes(root) == shard_hashes(energon_root)


def converted_copy(energon_root: Path, dest: Path) -> Path:
    """The output as the convert stage leaves it: shards and records, no index."""
    import shutil

    ignore = shutil.ignore_patterns(".nv-meta", "index.txt", "*.tar.idx", "empty_encodings")
    shutil.copytree(energon_root, dest, ignore=ignore)
    return dest


def index_files(root: Path) -> dict[str, object]:
    """What the index stage writes, comparable across runs (index.uuid is random; the sqlite by its rows,
    which energon's workers insert in any order)."""
    import sqlite3
    from contextlib import closing

    found: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.name == "index.sqlite":
            with closing(sqlite3.connect(path)) as db:
                found[name] = sorted(db.iterdump())
        elif path.is_file() and not name.startswith((".flux-prep", "train/shard", "val/shard")):
            found[name] = path.read_bytes() if path.name != "index.uuid" else "uuid"
        elif path.name.endswith(".tar.idx"):
            found[name] = path.read_bytes()
    return found


def _index_when_told(root: str, source: str, go: Any, workers: int) -> None:
    from flux_cluster.data.prep.index import index

    go.wait()
    try:
        index(Path(root), Path(source), workers)
    except BaseException as exc:  # the test reads the exit code; the reason goes to its stderr
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)


def test_concurrent_index_stages_of_one_output_agree(
    synthetic: Path, energon_root: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two runs index one output at once: the second waits for the first and keeps its index."""
    import multiprocessing

    import megatron.energon.flavors.webdataset  # noqa: F401  imported once, before the forks

    context = multiprocessing.get_context("fork")  # both runs start together, imports done
    for trial in range(3):  # the runs must overlap; unlocked, 8 of 10 such pairs failed
        root = converted_copy(energon_root, tmp_path / f"shared{trial}")
        go = context.Event()
        runs = [
            context.Process(target=_index_when_told, args=(str(root), str(synthetic), go, workers))
            for workers in (1, 2)
        ]
        for run in runs:
            run.start()
        go.set()
        for run in runs:
            run.join(120)
        assert [run.exitcode for run in runs] == [0, 0], capfd.readouterr().err[-3000:]
        assert "already indexed for these shards" in capfd.readouterr().err
        assert index_files(root) == index_files(energon_root)


@pytest.mark.parametrize("leave_kb", [16, 64])
def test_a_full_disk_during_index_is_one_line_and_a_rerun_redoes_it(
    synthetic: Path,
    energon_root: Path,
    tmp_path: Path,
    cli: CliRunner,
    capfd: pytest.CaptureFixture[str],
    leave_kb: int,
) -> None:
    """Energon's sqlite, or a worker's .tar.idx, hits the full disk (which one depends on the space left)."""
    from data_helpers import fill_disk, small_disk

    from flux_cluster.data.prep.index import is_indexed

    with small_disk(tmp_path / "disk") as disk:
        root = converted_copy(energon_root, disk / "root")
        fill_disk(disk, leave=leave_kb << 10)
        args = ["prepare-data", "--input", str(synthetic), "--output", str(root), "--stage", "index"]
        code, output = run_cli(cli, *args)
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1, output
        assert errors[0].startswith(f"error: no space left on device while writing {root}/"), errors
        assert errors[0].endswith(": free space and rerun")
        assert "Traceback" not in output + capfd.readouterr().err  # nor from energon's worker processes
        assert not is_indexed(root)
        assert not [p.name for p in root.glob("*/.*") if not p.name.startswith(".shard_")], "temporaries"
        (disk / "filler").unlink()
        code, output = run_cli(cli, *args)
        assert code == 0, output
        assert index_files(root) == index_files(energon_root)


def test_data_info_names_a_truncated_shard_in_one_line(
    energon_root: Path, tmp_path: Path, cli: CliRunner
) -> None:
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(energon_root, root)
    shard = root / "val" / "shard_000000.tar"
    shard.write_bytes(shard.read_bytes()[:100_000])
    code, output = run_cli(cli, "data", "info", str(root))
    assert code == 2, output
    (line,) = [line for line in output.splitlines() if line.startswith("error:")]
    assert f"error: {shard} has 100,000 bytes, its conversion wrote" in line
    assert f"'flux-cluster prepare-data --output {root} --stage verify'" in line
    # Without conversion's record (data prepared elsewhere), reading the shard finds it.
    (root / ".flux-prep" / "val" / "shard_000000.tar.json").unlink()
    code, output = run_cli(cli, "data", "info", str(root), "--load", "1")
    assert code == 2, output
    (line,) = [line for line in output.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {root / 'val'}: a shard could not be read (ReadError"), line
