"""Load a system: find its YAML, follow ``extends``, expand ``${VAR}``, apply ``--set``, validate.

Every leaf value remembers where it came from (a file, an environment variable, ``--set`` or the
schema default) so ``flux-cluster systems show`` can explain the resolved config.
"""

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from flux_cluster.config.schema import SystemConfig
from flux_cluster.errors import FluxClusterError
from flux_cluster.resources import systems_dir

SYSTEMS_PATH_ENV = "FLUX_CLUSTER_SYSTEMS"
"""os.pathsep-separated folders of site system configs, searched before the shipped ones."""

# ${VAR}, ${VAR:-default}, and $$ for a literal '$'.
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_FREE_FORM = {"env"}  # mappings whose keys are user data, not schema fields


class ConfigLoader(yaml.SafeLoader):
    """YAML 1.1 reads '12:00:00' as the base-60 integer 43200; here such values stay strings (walltimes)."""


ConfigLoader.yaml_implicit_resolvers = {
    first: [
        (tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


@dataclass(frozen=True)
class ResolvedSystem:
    config: SystemConfig
    sources: dict[str, str]
    """Dotted key -> where its value came from."""
    file: Path

    def source_of(self, key: str) -> str:
        return self.sources.get(key, "default")


def search_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get(SYSTEMS_PATH_ENV, "").split(os.pathsep) if p]
    return [*extra, systems_dir()]


def known_systems() -> dict[str, Path]:
    """Selectable systems by name; files starting with '_' are bases for ``extends`` only."""
    found: dict[str, Path] = {}
    for folder in reversed(search_dirs()):  # earlier folders win
        for path in sorted(folder.glob("*.yaml")):
            if not path.name.startswith("_"):
                found[path.stem] = path
    return dict(sorted(found.items()))


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _find_file(name: str, near: Path | None = None) -> Path:
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return Path(name)
    folders = ([near] if near else []) + search_dirs()
    for folder in folders:
        candidate = folder / f"{name}.yaml"
        if candidate.is_file():
            return candidate
    known = ", ".join(known_systems())
    hint = difflib.get_close_matches(name, list(known_systems()), n=1)
    did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise FluxClusterError(f"unknown system {name!r}{did_you_mean}; known systems: {known}")


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(), Loader=ConfigLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise FluxClusterError(f"{_display(path)}:{where}: {problem}") from None
    except OSError as exc:
        raise FluxClusterError(f"{_display(path)}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise FluxClusterError(f"{_display(path)}: not UTF-8 text (byte {exc.start})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FluxClusterError(f"{_display(path)}: expected a mapping of keys at the top level")
    return data


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted leaves. Nested mappings become dotted keys, so a child file overrides single values."""
    leaves: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            leaves.update(_flatten(value, f"{dotted}."))
        else:
            leaves[dotted] = value
    return leaves


def _unflatten(leaves: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for dotted, value in leaves.items():
        node = tree
        *parents, last = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):  # a scalar replaced by a mapping further down the chain
                child = node[part] = {}
            node = child
        node[last] = value
    return tree


def _load_chain(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    if path.resolve() in seen:
        chain = " -> ".join(_display(p) for p in (*seen, path.resolve()))
        raise FluxClusterError(f"{_display(path)}: extends: cycle {chain}")
    data = _read_yaml(path)
    bases = data.pop("extends", [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise FluxClusterError(f"{_display(path)}: extends: expected a system name or a list of names")
    leaves: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for base in bases:
        base_leaves, base_sources = _load_chain(_find_file(base, near=path.parent), (*seen, path.resolve()))
        _merge(leaves, sources, base_leaves, base_sources)
    own = _flatten(data)
    _merge(leaves, sources, own, dict.fromkeys(own, _display(path)))
    return leaves, sources


def _merge(leaves: dict, sources: dict, new: Mapping[str, Any], new_sources: Mapping[str, str]) -> None:
    for key, value in new.items():
        # A new value replaces the key and everything below it (e.g. 'env: {}' clears a base's env).
        for old in [k for k in leaves if k.startswith(f"{key}.") or key.startswith(f"{k}.")]:
            del leaves[old]
            sources.pop(old, None)
        leaves[key] = value
        sources[key] = new_sources[key]


def _interpolate(leaves: dict[str, Any], sources: dict[str, str], environ: Mapping[str, str]) -> None:
    def expand(value: Any, key: str, used: list[str]) -> Any:
        if isinstance(value, list):
            return [expand(v, key, used) for v in value]
        if not isinstance(value, str):
            return value

        def replace(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            name, default = match.group(1), match.group(2)
            used.append(name)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            raise FluxClusterError(
                f"{sources[key]}: {key}: environment variable {name} is not set "
                f"(export it, or write ${{{name}:-default}})"
            )

        return _VAR.sub(replace, value)

    for key in list(leaves):
        used: list[str] = []
        leaves[key] = expand(leaves[key], key, used)
        if used:
            sources[key] = f"{sources[key]} (${{{'}, ${'.join(used)}}})"


def _parse_override(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise FluxClusterError(f"--set {text!r}: expected KEY=VALUE, e.g. --set nodes=4")
    try:
        value = yaml.load(raw, Loader=ConfigLoader) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] = SystemConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        sub = [a for a in (field.annotation, *get_args(field.annotation)) if isinstance(a, type)]
        nested = [a for a in sub if issubclass(a, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def _origin(key: str, sources: Mapping[str, str], file: Path) -> str:
    """Who set the value at key: itself, else something below it, else its nearest parent, else the file."""
    children = [sources[k] for k in sources if k.startswith(f"{key}.")]
    parents = [sources[k] for k in _parents(key) if k in sources]
    return sources.get(key) or next(iter(children + parents), _display(file))


def _value_at(tree: Any, loc: tuple[Any, ...]) -> tuple[bool, Any]:
    for part in loc:
        in_mapping = isinstance(tree, Mapping) and part in tree
        in_list = isinstance(tree, list) and isinstance(part, int) and part < len(tree)
        if not (in_mapping or in_list):
            return False, None
        tree = tree[part]
    return True, tree


def _explain(
    error: Mapping[str, Any], tree: Mapping[str, Any], sources: Mapping[str, str], file: Path
) -> str:
    loc = tuple(error["loc"])
    key = ".".join(str(p) for p in loc) or "(top level)"
    origin = _origin(key, sources, file)
    if error["type"] == "extra_forbidden":
        model = _model_at(loc[:-1])
        options = list(model.model_fields) if model else []
        hint = difflib.get_close_matches(str(loc[-1]), options, n=1, cutoff=0.5)
        suggestion = f"; did you mean {'.'.join([*map(str, loc[:-1]), hint[0]])!r}?" if hint else ""
        valid = f" (valid keys here: {', '.join(options)})" if options and not hint else ""
        return f"{origin}: {key}: unknown key{suggestion}{valid}"
    message = str(error["msg"])
    for prefix, replacement in (("Input should be ", "expected "), ("Value error, ", ""), ("String ", "")):
        if message.startswith(prefix):
            message = replacement + message[len(prefix) :]
    if error["type"] == "missing":
        return f"{origin}: {key}: required key is missing"
    found, value = _value_at(tree, loc)
    if found and error["type"] != "value_error":
        return f"{origin}: {key}: got {value!r} ({type(value).__name__}), {message}"
    return f"{origin}: {key}: {message}"


def _parents(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def load_system(
    name: str, overrides: Sequence[str | tuple[str, str]] = (), environ: Mapping[str, str] | None = None
) -> ResolvedSystem:
    """Resolve a system by name (or YAML path): extends chain, ${VAR} expansion, overrides.

    An override is 'KEY=VALUE' (recorded as coming from --set) or ('KEY=VALUE', 'its origin').
    """
    environ = os.environ if environ is None else environ
    path = _find_file(name)
    leaves, sources = _load_chain(path)
    _interpolate(leaves, sources, environ)
    for override in overrides:
        text, origin = (override, "--set") if isinstance(override, str) else override
        key, value = _parse_override(text)
        _merge(leaves, sources, {key: value}, {key: origin})
    leaves.setdefault("name", path.stem)
    sources.setdefault("name", _display(path))
    tree = _unflatten(leaves)
    try:
        config = SystemConfig.model_validate(tree)
    except ValidationError as exc:
        raise FluxClusterError(_explain(exc.errors()[0], tree, sources, path)) from None
    return ResolvedSystem(config=config, sources=sources, file=path)


def flat_view(resolved: ResolvedSystem) -> list[tuple[str, Any, str]]:
    """(key, value, source) rows of the fully resolved config, defaults included."""
    dumped = resolved.config.model_dump(mode="json")
    rows = []
    for key, value in _flatten(dumped).items():
        free_form_parent = key.split(".")[0] in _FREE_FORM
        source = resolved.sources.get(key) or (
            next((resolved.sources[p] for p in _parents(key) if p in resolved.sources), None)
            if free_form_parent
            else None
        )
        rows.append((key, value, source or "default"))
    return rows
