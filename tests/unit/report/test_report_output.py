"""What the report prints (issues 27 and 31): plots that say why they are empty, tables never cut when
piped, every Table printed through print_table, CSV cells without control characters, help text as typed."""

import ast
import io
import re
import shutil
from pathlib import Path

import pytest
from report_samples import GROUP, sample
from rich.console import Console
from test_report_finetune import fine_tuning_run
from typer.testing import CliRunner

from flux_cluster.cli import app
from flux_cluster.report import plots
from flux_cluster.report.build import Options, build
from flux_cluster.report.formats import print_tables, render_markdown
from flux_cluster.report.harvest import RULESET_610_KEYS
from flux_cluster.report.html import render_html
from flux_cluster.report.scoring import GroupResult

__all__ = ["sample"]  # report_samples' fixture (the real v5.1 logs, unpacked once)
ROOT = Path(__file__).resolve().parents[3]


def _unscored(**changes: object) -> GroupResult:
    group = GroupResult(
        path="/r/h100/flux1", benchmark="flux1", system="h100", submitter=None, accelerator_model=None,
        accelerators=8, ruleset="5.1.0", runs=[], run_count=2, scored_runs=2, mean_minutes=3.07,
    )  # fmt: skip
    for key, value in changes.items():
        setattr(group, key, value)
    return group


def test_an_empty_plot_says_the_real_reason() -> None:
    svg = plots.time_to_train([_unscored()])
    assert "no minutes in these logs" not in svg
    assert "nothing to draw: no olympic score (2/2 runs scored: too few)" in svg
    assert "nothing to draw: no olympic score" in plots.scaling([_unscored()])
    assert "nothing to draw: no throughput in its logs" in plots.throughput([_unscored()])
    assert "no minutes in these logs" in plots.time_to_train([])  # nothing at all: that is the reason


def test_piped_tables_keep_every_value_whole(sample: Path, cli: CliRunner, tmp_path: Path) -> None:
    piped = cli.invoke(app, ["report", str(sample), "--no-check"])  # CliRunner's stdout is no terminal
    assert piped.exit_code == 0 and "\u2026" not in piped.stdout, piped.stdout
    system = GROUP.parts[-2]
    assert any(system in line and "160.71" in line for line in piped.stdout.splitlines())  # | grep tyche
    assert f"{sample / GROUP}" in piped.stdout  # the title's path, whole on its line

    deep = fine_tuning_run(tmp_path / ("a-rather-long-folder-name-" * 6) / "lora-run")
    out = tmp_path / "f.txt"
    assert cli.invoke(app, ["report", str(deep), "--no-check", "--wide", "-o", str(out)]).exit_code == 0
    text = out.read_text()
    assert "\u2026" not in text and any(
        str(deep / "results" / "best_0") in line for line in text.splitlines()
    )


def _table_names(tree: ast.AST) -> set[str]:
    """Names assigned a rich Table(...) in a module, and its functions that return one."""
    names = set()
    for node in ast.walk(tree):
        called = isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        if called and getattr(node.value.func, "id", None) == "Table":
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.FunctionDef) and "Table" in ast.unparse(node.returns or ast.Constant(None)):
            names.add(node.name)
    return names


def test_every_module_that_builds_a_table_prints_it_with_print_table() -> None:
    """print_table keeps piped values whole; console.print(table) would cut them at 80 columns."""
    builders, bypasses = [], []
    for path in sorted((ROOT / "flux_cluster").rglob("*.py")):
        source = path.read_text()
        if "Table(" not in source or path.name == "console.py":
            continue
        builders.append(path.name)
        tree = ast.parse(source)
        tables = _table_names(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "print" and node.args):
                continue
            first = node.args[0]
            name = first.func if isinstance(first, ast.Call) else first
            if getattr(name, "id", None) in tables:
                bypasses.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert {"columns.py", "verify.py", "preflight.py"} <= set(builders), builders
    assert not bypasses, "print these with flux_cluster.console.print_table:\n" + "\n".join(bypasses)


def _submission(sample: Path, root: Path, runs: int = 3) -> Path:
    """A copy of the v5.1 sample's layout with its first runs: <org>/results/<system>/flux1, systems/."""
    group = root / GROUP
    group.mkdir(parents=True)
    for i in range(runs):
        shutil.copy(sample / GROUP / f"result_{i}.txt", group)
    shutil.copytree(sample / GROUP.parents[2] / "systems", root / GROUP.parents[2] / "systems")
    return group


def test_the_ruleset_is_read_from_the_logs_or_the_path_and_shown(sample: Path, tmp_path: Path) -> None:
    plain = _submission(sample, tmp_path / "plain")
    (group,) = build([plain], Options(check=False))
    assert (group.ruleset, group.ruleset_from) == ("5.1.0", "assumed")
    assert any("give --ruleset" in w for w in group.warnings)
    out = io.StringIO()
    print_tables([group], Console(file=out, width=100), checked=False)
    assert "ruleset 5.1.0 (assumed: give --ruleset)" in out.getvalue()

    versioned = _submission(sample, tmp_path / "v6.0" / "closed")
    (group,) = build([versioned], Options(check=False))
    assert (group.ruleset, group.ruleset_from) == ("6.0.0", "path")
    (group,) = build([versioned], Options(check=False, ruleset="6.1.0"))
    assert (group.ruleset, group.ruleset_from) == ("6.1.0", "--ruleset")

    newer = _submission(sample, tmp_path / "newer")  # a 6.1.0 log: every disclosure key it requires
    for log in newer.glob("result_*.txt"):
        lines = [
            f':::MLLOG {{"time_ms": 1, "key": "{key}", "value": "1", "metadata": {{}}}}\n'.encode()
            for key in sorted(RULESET_610_KEYS)
        ]
        log.write_bytes(b"".join(lines) + log.read_bytes())
    (group,) = build([newer], Options(check=False))
    assert (group.ruleset, group.ruleset_from) == ("6.1.0", "logs")
    assert not any("give --ruleset" in w for w in group.warnings)


def test_a_scaled_score_shows_its_factor_and_gpu_hours_are_measured(sample: Path, tmp_path: Path) -> None:
    folder = _submission(sample, tmp_path / "scaled")
    (unscaled,) = build([folder], Options(check=False))
    (folder / "scaling.json").write_text('{"scaling_factor": 1.25}')
    (group,) = build([folder], Options(check=False))
    assert group.olympic_minutes == pytest.approx(unscaled.olympic_minutes * 1.25)
    assert group.gpu_hours == pytest.approx(unscaled.olympic_minutes * 16 / 60)  # not the scaled score
    out = io.StringIO()
    print_tables([group], Console(file=out, width=100), checked=False)
    row = next(line for line in out.getvalue().splitlines() if "tyche_ngpu16" in line and "RCP" in line)
    assert f"{group.olympic_minutes:.2f} (x1.25 RCP)" in row
    assert "tyche_ngpu16_ngc25.09_nemo (Tyche (1x NVIDIA GB200 NVL72))" in row  # the summarizer's name too
    assert "x1.25 RCP" in render_markdown([group]) and "x1.25 RCP" in plots.time_to_train([group])
    assert "RCP scaling factor 1.25" in render_html([group], checked=False)


def test_compare_shows_mfu_as_a_percent_as_every_other_output(sample: Path, tmp_path: Path) -> None:
    from flux_cluster.report.compare import compare
    from flux_cluster.report.formats import comparison_markdown, print_comparison

    a, b = _unscored(mfu=0.3125), _unscored(path="/r/mi300/flux1", system="mi300", mfu=0.25)
    comparison = compare(Path("/r"), [a], Path("/s"), [b])
    out = io.StringIO()
    print_comparison(comparison, Console(file=out, width=120))
    (row,) = [line for line in out.getvalue().splitlines() if "MFU" in line]
    assert "31.2%" in row and "25.0%" in row and "0.800x" in row and "0.3125" not in row, row
    markdown = "\n".join(comparison_markdown(comparison))
    assert "| MFU | 31.2% | 25.0% | 0.800x |" in markdown
    page = render_html([a, b], checked=False, comparison=comparison)
    assert "<td>31.2%</td><td>25.0%</td>" in page and "0.3125" not in page
    assert comparison["pairs"][0]["metrics"][6] == {
        "name": "MFU",
        "key": "mfu",
        "a": 0.3125,
        "b": 0.25,
        "ratio": 0.8,
    }


def _all_words(groups: list[GroupResult]) -> set[str]:
    """Every word of every cell any table of these groups has (--wide)."""
    from flux_cluster.report import formats

    texts = {c.text(g) for c in formats.FINE_TUNING_COLUMNS + formats.GROUP_COLUMNS for g in groups}
    for group in groups:
        texts |= {c.text(r) for c in formats.run_columns(group) for r in group.runs}
        texts |= {c.text(e) for c in formats.EVAL_COLUMNS for e in group.evals}
    return {word for text in texts for word in text.split()}


@pytest.mark.parametrize("width", [80, 120, 160])
def test_terminal_tables_fit_the_window_and_never_cut_a_number(
    sample: Path, tmp_path: Path, width: int
) -> None:
    """Issue 39: the fine-tuning table's 20 columns on 80-160 columns: its compact columns fitted to the
    window; a number is never cut ('best val loss 1.53...', 'samples to converge 11,30...') nor broken."""
    from test_report_eval import write_eval
    from test_report_finetune import _summary

    a = fine_tuning_run(
        tmp_path / "aws_p5-20261128-lora", minutes=[30.0, 34.0],
        summaries=[_summary(), _summary(best_eval_loss=1.53456)],
    )  # fmt: skip
    b = fine_tuning_run(tmp_path / "b", gpus=4, price=3.0, summaries=[_summary(images_per_s=150.0)])
    write_eval(a)
    groups = build([a, b, sample], Options(check=False))
    out = io.StringIO()
    print_tables(groups, Console(file=out, width=width, force_terminal=True, color_system=None), False)
    text = out.getvalue()
    rows = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert "\u2026" not in text and max(len(line) for line in rows) <= width, text
    words = _all_words(groups)
    cells = [cell.strip() for line in rows if line[0] == "│" for cell in line.strip("│").split("│")]
    number = re.compile(r"[-+]?[\d.,]*\d[\d.,]*[%*]?")
    broken = [w for cell in cells for w in cell.split() if number.fullmatch(w) and w not in words]
    assert not broken, text  # no part of a number: each is one whole value of its column
    for figure in ("1.5346", "7,864,320", "160.71", "8.53", "0.9873", "31.5"):  # best loss, samples, ...
        assert figure in cells, (figure, text)
    side = text.split("Fine-tuning, side by side")[1].split("No olympic score")[0]
    assert ("not shown at" in side) == (width == 80), side  # 80 leaves columns out, saying which
    wide = io.StringIO()
    print_tables(groups, Console(file=wide, width=width, force_terminal=True, color_system=None), False, True)
    assert "final val loss" in wide.getvalue().split("Fine-tuning, side by side")[1]  # --wide: every column
    assert "not shown at" not in wide.getvalue()
