"""A component's options, declared once: the keyword parameters of its factory.

A component's options are the keyword parameters of its factory (a class's
``__init__`` or a function): the annotation is the type, the default the
default, and ``typing.Annotated`` adds bounds (``annotated_types``, e.g.
``Ge(1)``, which pydantic enforces) and the help text (:class:`Help`)::

    def __init__(self, samples: Annotated[int, Ge(1), Help("answers per prompt")] = 4): ...

Validation (unknown keys, wrong types, values out of bounds, missing required
values: a :class:`ConfigError` naming the key path, the bad value and what is
allowed), ``scaffold config``'s filled-in defaults and ``scaffold list-plugins
--show-options`` all read that one declaration (:func:`option_table`); no
factory checks a range by hand.
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class Help:
    """An option's help text, in its ``Annotated`` declaration (shown by ``--show-options`` and in errors)."""

    text: str


@dataclass(frozen=True)
class OptionInfo:
    """One declared option: what ``--show-options`` lists."""

    name: str
    type: str
    default: Any  # ``...`` when required
    bounds: str
    help: str

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
        hints = typing.get_type_hints(target, include_extras=True)
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
    """Option name -> 'type (bounds) = default' text, for error messages."""
    return {o.name: o.type + (f" ({o.bounds})" if o.bounds else "") + ("" if o.default is ... else f" = {o.default!r}")
            for o in option_table(factory)}


def _type_text(annotation: Any) -> str:
    if annotation is Any or annotation is inspect.Parameter.empty:
        return "any"
    if isinstance(annotation, str):
        return annotation
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def option_table(factory: Any) -> list[OptionInfo]:
    """Every option ``factory`` declares, with its type, default, bounds and help, read from its signature."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception:
        hints = {}
    out = []
    for pname, param in inspect.signature(factory).parameters.items():
        if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL, param.POSITIONAL_ONLY):
            continue
        annotation, extras = _unwrap(hints.get(pname, param.annotation))
        help_text = " ".join(e.text for e in extras if isinstance(e, Help))
        bounds = ", ".join(_bound_text(e) for e in extras if not isinstance(e, Help))
        out.append(OptionInfo(pname, _type_text(annotation), ... if param.default is param.empty else param.default,
                              bounds, help_text))
    return out


def _unwrap(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """(the type, its ``Annotated`` extras), also for ``Annotated[int, Ge(1)] | None``."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        return base, tuple(extras)
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    if any(typing.get_origin(m) is typing.Annotated for m in members):
        unwrapped = [_unwrap(m) for m in members]
        return " | ".join(_type_text(t) for t, _ in unwrapped), tuple(e for _, extra in unwrapped for e in extra)
    return annotation, ()


def _bound_text(constraint: Any) -> str:
    """``>= 1`` for ``Ge(1)``, and so on (annotated_types); anything else as it prints."""
    symbols = {"Gt": ">", "Ge": ">=", "Lt": "<", "Le": "<=", "MultipleOf": "multiple of", "MinLen": "length >=",
               "MaxLen": "length <="}
    name = type(constraint).__name__
    if getattr(constraint, "pattern", None):  # pydantic's StringConstraints
        return f"matches {constraint.pattern}"
    if name in symbols:
        (value,) = [getattr(constraint, f) for f in constraint.__dataclass_fields__]
        return f"{symbols[name]} {value}"
    return repr(constraint)


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
