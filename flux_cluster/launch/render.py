"""Render job scripts from the Jinja templates in slurm/templates.

Every ``{{ expression }}`` goes through :func:`shell_quote` (Jinja's ``finalize`` hook), so no value
from a config, the CLI or the environment can reach the shell unquoted: quoting is not something a
template author can forget. StrictUndefined turns a misspelled variable into an error.
"""

import shlex
from collections.abc import Callable
from functools import cache

import jinja2

from flux_cluster.launch.plan import ArrayPlan, JobPlan
from flux_cluster.resources import templates_dir


def shell_quote(value: object) -> str:
    """One shell word for value. Text with a control character (ESC, BEL, a line break, a bidi control)
    becomes bash's $'...' with each such character as its UTF-8 bytes in \\xHH escapes, so the script (and a
    dry run that prints it) holds no raw control character, and bash still gets the exact text; shlex.quote
    would keep them raw."""
    if value is None or isinstance(value, bool):
        raise TypeError(f"refusing to render {value!r} into a shell script (template bug)")
    from flux_cluster.safe_text import printable

    text = str(value)
    if printable(text) == text:  # no control character
        return shlex.quote(text)
    if "\0" in text:
        raise ValueError("refusing to render a NUL character into a shell script (bash cannot hold one)")
    return "$'" + "".join(_ansi_c(char, printable) for char in text) + "'"


def _ansi_c(char: str, printable: "Callable[[str], str]") -> str:
    """One character inside $'...': a control character as the \\xHH escapes of its UTF-8 bytes."""
    if char in "\\'":
        return "\\" + char
    if printable(char) == char:
        return char
    return "".join(f"\\x{byte:02x}" for byte in char.encode())


def integer(value: object) -> int:
    """A number for an arithmetic context (``$(( ))``, ``for ((...))``): an int, never text, so the rendered
    literal is digits (bash would run a '$(...)' hidden in a variable's array subscript there)."""
    if type(value) is not int:
        raise TypeError(f"refusing to render {value!r} as an integer literal (template bug)")
    return value


@cache
def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        undefined=jinja2.StrictUndefined,
        finalize=shell_quote,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["integer"] = integer
    return environment


def template_name(plan: JobPlan) -> str:
    return "local.sh.j2" if plan.system.launcher == "local" else "sbatch.sh.j2"


def render_script(plan: JobPlan) -> str:
    text = _environment().get_template(template_name(plan)).render(p=plan, s=plan.system)
    return text


def render_array(plan: ArrayPlan) -> str:
    """A sweep array's script: the shared #SBATCH lines, then task i runs point i's job script."""
    return _environment().get_template("sweep_array.sh.j2").render(p=plan, s=plan.system)


def allocation(plan: JobPlan) -> tuple[str, ...]:
    """The #SBATCH lines of a Slurm job but its own output files: jobs whose lines are the same can be
    tasks of one array."""
    header = _environment().get_template("_sbatch_header.sh.j2").render(p=plan, s=plan.system)
    own = ("#SBATCH --output=", "#SBATCH --error=")
    return tuple(
        line for line in header.splitlines() if line.startswith("#SBATCH") and not line.startswith(own)
    )
