"""Validate a component's YAML options against its factory's signature.

A component's options are the keyword parameters of its factory (a class's
``__init__`` or a function), with their type annotations. Unknown keys, wrong
types and missing required values are reported as :class:`ConfigError` naming
the key path, the bad value and what is allowed.
"""

from __future__ import annotations

import difflib
import inspect
import typing
from typing import Any

from ..errors import ConfigError

_MODEL_CACHE: dict[int, tuple[Any, Any]] = {}


def _signature_model(factory: Any) -> tuple[Any, list[str], bool]:
    """Return (pydantic model, parameter names, accepts_any_kwargs) for ``factory``."""
    cached = _MODEL_CACHE.get(id(factory))
    if cached is not None and cached[0] is factory:
        return cached[1]
    from pydantic import ConfigDict, create_model

    target = factory.__init__ if inspect.isclass(factory) else factory
    sig = inspect.signature(factory)
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # unresolvable annotations: accept anything for those
        hints = {}
    fields: dict[str, Any] = {}
    var_kw = False
    for pname, param in sig.parameters.items():
        if param.kind is param.VAR_KEYWORD:
            var_kw = True
            continue
        if param.kind in (param.VAR_POSITIONAL, param.POSITIONAL_ONLY):
            continue
        annotation = hints.get(pname, Any)
        default = ... if param.default is param.empty else param.default
        fields[pname] = (annotation, default)
    model = create_model(
        f"Options_{getattr(factory, '__name__', 'component')}",
        __config__=ConfigDict(extra="allow" if var_kw else "forbid", arbitrary_types_allowed=True),
        **fields,
    )
    result = (model, list(fields), var_kw)
    _MODEL_CACHE[id(factory)] = (factory, result)
    return result


def describe_options(factory: Any) -> dict[str, str]:
    """Option name -> 'type = default' text, for docs and error messages."""
    sig = inspect.signature(factory)
    out = {}
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL, param.POSITIONAL_ONLY):
            continue
        ann = param.annotation
        ann_text = ann if isinstance(ann, str) else getattr(ann, "__name__", repr(ann))
        if ann is param.empty:
            ann_text = "any"
        out[pname] = f"{ann_text}" + ("" if param.default is param.empty else f" = {param.default!r}")
    return out


def validate_options(factory: Any, options: dict[str, Any], *, path: str, label: str) -> dict[str, Any]:
    """Validate ``options`` for ``factory``; return the coerced keyword arguments."""
    from pydantic import ValidationError

    model, names, var_kw = _signature_model(factory)
    if not var_kw:
        unknown = [k for k in options if k not in names]
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            allowed = ", ".join(names) or "(none: this component takes no options)"
            raise ConfigError(f"{path}.{key}: unknown option for {label}.{hint} Allowed options: {allowed}")
    try:
        validated = model(**options)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, path=path, label=label, factory=factory)) from None
    values = {k: getattr(validated, k) for k in validated.model_fields_set if k in names}
    if var_kw:
        values.update({k: v for k, v in options.items() if k not in names})
    return values


def _format_validation_error(exc: Any, *, path: str, label: str, factory: Any) -> str:
    described = describe_options(factory)
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        key = loc.split(".")[0] if loc else ""
        full = f"{path}.{loc}" if loc else path
        if err.get("type") == "missing":
            lines.append(f"{full}: required option of {label} is missing (expected {described.get(key, 'a value')})")
        else:
            bad = err.get("input")
            lines.append(
                f"{full}: {err.get('msg')}; got {bad!r} ({type(bad).__name__}). "
                f"{label} expects {key}: {described.get(key, 'see its docs')}"
            )
    return "\n".join(lines)


def build_component(info: Any, options: dict[str, Any], *, path: str) -> Any:
    """Validate options and call the component factory, naming the plugin on failure."""
    label = f"{info.kind} {info.name!r}"
    kwargs = validate_options(info.factory, options, path=path, label=label)
    try:
        return info.factory(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: {label} (plugin {info.plugin!r}) rejected its options: {exc}") from exc
