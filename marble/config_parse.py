"""Strict parsing of YAML mappings into typed dataclass trees (the machinery of marble.config).

Generic over the dataclasses it is given: an unknown key, a value of the wrong type or a
string key that YAML read as a number is a ConfigError naming the dotted key and where the
value came from. marble.config holds the tree itself (RunConfig) and the presets.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml


class ConfigError(ValueError):
    """A configuration problem; the message names the key and its origin."""


def type_ok(value: Any, tp: Any) -> bool:
    origin = get_origin(tp)
    if tp is Any:
        return True
    if origin is Literal:
        return value in get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(type_ok(value, a) for a in get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        (inner,) = get_args(tp) or (Any,)
        return isinstance(value, list) and all(type_ok(v, inner) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def build(cls: type, data: Any, where: str, origin: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: `{where or 'config'}` must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in names:
            raise ConfigError(
                f"{origin}: unknown config key `{path}` (known keys here: {sorted(names)})"
            )
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = build(tp, value, path, origin)
        elif get_origin(tp) is list and dataclasses.is_dataclass(get_args(tp)[0]):
            if not isinstance(value, list):
                raise ConfigError(f"{origin}: `{path}` must be a list, got {value!r}")
            item_cls = get_args(tp)[0]
            kwargs[key] = [build(item_cls, v, f"{path}[{i}]", origin) for i, v in enumerate(value)]
        else:
            if not type_ok(value, tp):
                if is_string_key(tp) and isinstance(value, (int, float)):
                    # YAML reads 0123456 as the octal 42798: the text is gone, only quoting keeps it.
                    raise ConfigError(f"{origin}: `{path}` must be a string, but YAML read a number "
                                      f"({value!r}); quote the value, e.g. {path.rsplit('.', 1)[-1]}: \"...\"")
                raise ConfigError(f"{origin}: `{path}` = {value!r} is not a valid {tp_name(tp)}")
            kwargs[key] = float(value) if tp is float else value
    return cls(**kwargs)


def tp_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "options":
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping. PyYAML keeps the last
    value silently, so a site file with `account:` twice ran with whichever came second; the
    error is a yaml.YAMLError whose mark is the second key's line (every reader reports it)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line)
                except TypeError:  # an unhashable key: SafeLoader's own error follows
                    continue
                if first != key_node.start_mark.line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first at line {first + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str):
    """The one YAML reader of what users write (configs, site files, manifests, records):
    safe, and a duplicated key is an error naming its line."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """`line N: problem` of a YAML error (where it breaks, on one line)."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark is not None else ""
    return f"{where}{getattr(exc, 'problem', None) or exc}"


def read_yaml(path: Path) -> dict:
    try:
        data = load_yaml(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {yaml_error_line(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def declared_type(path: list[str], cls: type) -> Any:
    """The annotation of a dotted key in the dataclass tree `cls` (None where the path is not a plain field)."""
    tp: Any = cls
    for part in path:
        if not dataclasses.is_dataclass(tp):
            return None
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return None
        tp = hints[part]
    return tp


def is_string_key(tp: Any) -> bool:
    """`str` or `str | None`: a value YAML must not coerce (`0123456` is a revision, not 42798)."""
    return tp is str or (get_origin(tp) in (typing.Union, types.UnionType)
                         and set(get_args(tp)) == {str, type(None)})


def parse_override(item: str, root: type) -> dict:
    """`a.b.c=value` -> {"a": {"b": {"c": value}}}, the value parsed as YAML, except for
    string keys, which keep the text as given."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    tp = declared_type(key.strip().split("."), root)
    if is_string_key(tp) and raw.strip() not in ("null", "~", ""):
        value: Any = raw.strip()
        if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
            value = yaml.safe_load(value)  # an explicitly quoted string: unquote it
    else:
        value = yaml.safe_load(raw) if raw.strip() else ""
    if isinstance(value, str) and not is_string_key(tp):
        # YAML 1.1 reads `1e-3` (no dot) as a string; users mean the number.
        try:
            value = float(value)
        except ValueError:
            pass
    out: dict = {}
    node = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out
