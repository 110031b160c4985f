"""--dependency takes exactly what sbatch's --dependency does (its man page); anything else is one line."""

import pytest

from flux_cluster.errors import FluxClusterError
from flux_cluster.launch.plan import check_dependency
from flux_cluster.launch.sweep_plan import check_sweep_dependency


@pytest.mark.parametrize(
    "text",
    [
        "afterok:123",
        "afterany:123:456",
        "singleton",
        "after:123+5",
        "after:123+5:124",
        "aftercorr:77",
        "afternotok:8",
        "afterburstbuffer:9",
        "afterok:123_4",  # one task of an array
        "afterok:1,afterany:2:3,singleton",
        "afterok:1?afternotok:1",
        "123",  # a bare id: afterany (slurmctld's oldest form)
        "123_4",
        "123_*",  # every task of an array
        "afterok:123_*",
        "afterany:1_*:2_3",
        "1,2,singleton",  # bare ids after a bare id: slurmctld's oldest form, JOBID,JOBID,...
        "afterok:1,2,3",  # a bare id after the typed parts
        "afterok:1?2",  # last in a '?' list
        "singleton?2",
        "AfterOK:123",  # slurmctld compares the type names case-insensitively
        "SINGLETON",
        "After:5+10",
    ],
)
def test_slurms_forms_are_taken(text: str) -> None:
    check_dependency(text)


@pytest.mark.parametrize(
    "text",
    [
        "whenever:1",
        "afterok",
        "afterok:",
        "afterok:x",
        "afterok:_1",
        "afterok:1_",
        "afterok:1__2",
        "afterok:1+5",  # a delay is after's alone
        "after:1+",
        "singleton:1",
        "afterok:1,afterany:2?afterok:3",  # ',' and '?' in one list
        "afterok:1,",
        "afterok:1 ",
        "afterok:1\nafterok:2",
        "",
        "123:456",  # a bare id is one id
        "123+5",
        "123_**",
        "afterok:1_*_2",
        "*",
        "afterok:*",
        "afterok:1,2?3",
        "1,afterok:2",  # after a bare id slurmctld takes no TYPE: (sbatch: "Job dependency problem")
        "1,singleton,afterok:2",
        "1?2",  # in a '?' list only the last part may be bare
        "1?singleton",
        "afterok:1?2?3",
        "1_*?2_*",
        "aftero\u212a:1",  # KELVIN SIGN folds onto 'k' in Unicode, not for Slurm
        "afterok:\uff11",  # FULLWIDTH DIGIT ONE: [0-9] only
    ],
)
def test_anything_else_is_one_line(text: str) -> None:
    with pytest.raises(FluxClusterError) as refused:
        check_dependency(text)
    line = str(refused.value)
    assert line.startswith(f"--dependency {text!r}: expected TYPE:JOBID") and "\n" not in line


def test_a_sweep_with_a_window_cannot_join_its_waits_to_an_any_of_list() -> None:
    check_sweep_dependency("afterok:1?afterok:2", True, None)
    check_sweep_dependency("afterok:1,afterok:2", True, 2)
    with pytest.raises(FluxClusterError, match="Slurm cannot join to a '\\?' \\(any of\\) list"):
        check_sweep_dependency("afterok:1?afterok:2", True, 2)
