"""docs/plugins.md's table of which package adds what matches what the repository's plugins register."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from scaffold_core.plugins import get_plugins

ROOT = Path(__file__).resolve().parents[1]


def documented() -> dict[str, tuple[set[str], set[tuple[str, str]]]]:
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    section = text.split("## Which package adds what", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[set[str], set[tuple[str, str]]]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        commands = set(re.findall(r"`([^`]+)`", cells[1]))
        components = set()
        for part in cells[2].split(";"):
            kind, _, names = part.partition(":")
            components |= {(kind.strip(), n) for n in re.findall(r"`([^`]+)`", names)} if names else set()
        for package in re.findall(r"`([^`]+)`", cells[0]):
            rows[package] = (commands, components)
    return rows


def test_every_plugin_in_the_repository_is_listed_with_its_components_and_commands():
    rows = documented()
    in_repo = {p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists()}
    assert in_repo <= set(rows), f"docs/plugins.md lacks {sorted(in_repo - set(rows))}"
    plugins = get_plugins()
    for info in plugins.plugin_infos():
        if info.distribution not in in_repo or info.status != "ok":
            continue
        registered = {(kind, name) for kind, names in info.components.items() for name in names}
        assert registered == rows[info.distribution][1], info.distribution
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    assert plugins.add_commands(sub) == []
    for impl in plugins.pm.hook.register_commands.get_hookimpls():
        dist = plugins.dist_of(impl.plugin_name)[0]
        mine = argparse.ArgumentParser().add_subparsers()
        impl.function(subparsers=mine)
        assert set(mine.choices) == rows[dist][0], dist
