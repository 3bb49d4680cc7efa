"""A typed facade over the lifecycle hooks: core code never calls ``pm.hook`` directly.

Each implementation is called on its own, so one plugin raising never stops
another's; errors are logged with the plugin's name and counted.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import PluginHookError

log = logging.getLogger("scaffold.hooks")


class Hooks:
    def __init__(self, pm: Any | None):
        self.pm = pm
        self.errors: Counter[str] = Counter()
        self._warned: set[tuple[str, str]] = set()
        self._episode_end = self._impls("on_episode_end")
        self._wrappers = [(name, fn) for name, fn in self._impls("engine_request")]

    def _impls(self, hook_name: str) -> list[tuple[str, Callable[..., Any]]]:
        if self.pm is None:
            return []
        hook = getattr(self.pm.hook, hook_name)
        # pluggy calls later-registered and tryfirst implementations first; keep its order.
        return [(impl.plugin_name, _bind(impl)) for impl in reversed(hook.get_hookimpls())]

    def _report(self, plugin: str, hook: str, exc: BaseException) -> None:
        self.errors[plugin] += 1
        if (plugin, hook) not in self._warned:
            self._warned.add((plugin, hook))
            log.warning("plugin %r raised in %s: %s: %s (further errors are counted, not logged)",
                        plugin, hook, type(exc).__name__, exc)

    def _call_all(self, hook_name: str, **kwargs: Any) -> None:
        for plugin, fn in self._impls(hook_name):
            try:
                fn(**kwargs)
            except Exception as exc:
                self._report(plugin, hook_name, exc)

    def run_start(self, config: Any, output_dir: str | None) -> None:
        self._call_all("on_run_start", config=config, output_dir=output_dir)

    def run_end(self, metrics: dict, output_dir: str | None) -> None:
        self._call_all("on_run_end", metrics=metrics, output_dir=output_dir)

    def episode_end(self, result: Any) -> None:
        for plugin, fn in self._episode_end:
            try:
                fn(result=result)
            except Exception as exc:
                self._report(plugin, "on_episode_end", exc)

    @property
    def has_request_wrappers(self) -> bool:
        return bool(self._wrappers)

    async def wrap_request(self, request: Any, engine: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``call()`` inside every ``engine_request`` wrapper, across the await."""
        entered = []
        try:
            for plugin, fn in self._wrappers:
                gen = fn(request=request, engine=engine)
                next(gen)
                entered.append((plugin, gen))
        except Exception as exc:
            self._unwind(entered, exc)
            plugin = self._wrappers[len(entered)][0]
            raise PluginHookError(f"plugin {plugin!r} raised in engine_request: {type(exc).__name__}: {exc}",
                                  plugin) from exc
        try:
            result = await call()
        except BaseException as exc:
            self._unwind(entered, exc)
            raise
        for plugin, gen in reversed(entered):
            try:
                gen.send(result)
            except StopIteration as stop:
                if stop.value is not None:
                    result = stop.value
            except Exception as exc:
                raise PluginHookError(
                    f"plugin {plugin!r} raised in engine_request: {type(exc).__name__}: {exc}", plugin) from exc
            else:
                raise PluginHookError(f"plugin {plugin!r}: engine_request wrapper yielded more than once", plugin)
        return result

    @staticmethod
    def _unwind(entered: list[tuple[str, Any]], exc: BaseException) -> None:
        for _plugin, gen in reversed(entered):
            try:
                gen.throw(exc)
            except BaseException:
                pass


def _bind(impl: Any) -> Callable[..., Any]:
    """Call a hookimpl with only the arguments it declares (pluggy's opt-in arguments)."""
    argnames = tuple(impl.argnames)
    function = impl.function

    def call(**kwargs: Any) -> Any:
        return function(**{k: kwargs[k] for k in argnames})

    return call
