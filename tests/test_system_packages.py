"""`make setup` installs the system packages the project needs (SYSTEM_PACKAGES in the Makefile) when it can, and
says what to install when it cannot; CI gets them through `make test`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "system-packages.sh"


def system_packages() -> list[str]:
    found = re.search(r"^SYSTEM_PACKAGES :=(.*)$", (REPO / "Makefile").read_text(), flags=re.M)
    assert found, "the Makefile lists the system packages in SYSTEM_PACKAGES"
    return found.group(1).split()


def test_setup_installs_the_listed_system_packages_and_ci_runs_setup():
    makefile = (REPO / "Makefile").read_text()
    assert "bubblewrap:bwrap" in system_packages()
    assert re.search(r"^setup: system-packages ", makefile, flags=re.M)
    assert "scripts/system-packages.sh $(SYSTEM_PACKAGES)" in makefile
    assert re.search(r"^test: setup", makefile, flags=re.M)
    ci = (REPO / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line and not line.startswith("#")][-1] == "exec make test"


def fake_commands(folder: Path, uid: int) -> dict[str, str]:
    """A PATH where `id -u` says ``uid`` and `apt-get` records its arguments in ``folder/apt.log``."""
    folder.mkdir()
    (folder / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (folder / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {folder / 'apt.log'}\n")
    for name in ("id", "apt-get"):
        (folder / name).chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env)


def test_nothing_happens_when_every_package_is_present(tmp_path):
    env = fake_commands(tmp_path / "bin", uid=0)
    done = run(["coreutils:sh"], env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not (tmp_path / "bin" / "apt.log").exists()


def test_root_with_apt_installs_what_is_missing(tmp_path):
    env = fake_commands(tmp_path / "bin", uid=0)
    done = run(["coreutils:sh", "nosuchpkg:nosuchcommand-xyz"], env)
    assert done.returncode == 0 and "installing system packages: nosuchpkg" in done.stdout
    log = (tmp_path / "bin" / "apt.log").read_text().splitlines()
    assert log == ["update -qq", "install -y -qq --no-install-recommends nosuchpkg"]


def test_without_root_it_says_what_to_install_and_goes_on(tmp_path):
    env = fake_commands(tmp_path / "bin", uid=1000)
    done = run(["nosuchpkg:nosuchcommand-xyz"], env)
    assert done.returncode == 0, done.stderr
    assert "missing system packages: nosuchpkg" in done.stderr and "sudo apt-get install nosuchpkg" in done.stderr
    assert not (tmp_path / "bin" / "apt.log").exists()


def test_a_library_counts_as_present_when_the_loader_knows_it(tmp_path):
    """A package that provides a library (libseccomp2:libseccomp.so.2) is checked in the loader's cache."""
    env = fake_commands(tmp_path / "bin", uid=0)
    cache_line = "\tlibknown.so.2 (libc6,x86-64) => /lib/libknown.so.2"
    (tmp_path / "bin" / "ldconfig").write_text(f"#!/bin/sh\necho '{cache_line}'\n")
    (tmp_path / "bin" / "ldconfig").chmod(0o755)
    done = run(["known:libknown.so.2", "unknown:libunknown.so.1"], env)
    assert done.returncode == 0 and "installing system packages: unknown" in done.stdout
    log = (tmp_path / "bin" / "apt.log").read_text().splitlines()
    assert log == ["update -qq", "install -y -qq --no-install-recommends unknown"]
