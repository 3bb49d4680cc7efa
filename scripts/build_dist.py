"""Build reproducible wheels and sdists of scaffold-core and every plugin: what `make dist` runs.

    python scripts/build_dist.py [--outdir dist] [--only scaffold-core,scaffold-gsm8k]

Each project is copied out of the checkout first (so building writes nothing into it) and built with
``python -m build --no-isolation`` (the build backend comes from the running environment: no network; its
requirements are checked once for every project, before the first build, rather than by each build).
``SOURCE_DATE_EPOCH`` (default: the time of the last commit) fixes every timestamp: wheels come out
byte-identical from identical sources, and sdists are rewritten with sorted entries, fixed owners and
times, so they do too. ``SHA256SUMS`` lists every file built.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Top-level folders of the checkout that are not part of scaffold-core's distribution.
CORE_SKIP = ("tests", "docs", "bench", "plugins", "libs", "runs", "examples", "scripts", "dist", ".github")
#: Build outputs and caches, left out at any depth.
NOT_SOURCE = ("build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".venv", ".git", ".pytest_cache",
              ".hypothesis", ".mypy_cache", ".ruff_cache")
#: Used when no commit time is known: 1980-01-01, the earliest time a zip file can hold.
DEFAULT_EPOCH = 315532800


def projects() -> dict[str, Path]:
    """Distribution name -> project folder: the core, then each in-repo library (libs/), then each plugin."""
    out = {"scaffold-core": ROOT}
    for folder in [*sorted((ROOT / "libs").glob("scaffold-*")), *sorted((ROOT / "plugins").glob("scaffold-*"))]:
        if (folder / "pyproject.toml").is_file():
            out[folder.name] = folder
    return out


def build_requirements(folders: list[Path]) -> list[str]:
    """The ``[build-system] requires`` of the projects in ``folders``, each once."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    found: list[str] = []
    for folder in folders:
        data = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))
        for requirement in data.get("build-system", {}).get("requires", []):
            if requirement not in found:
                found.append(requirement)
    return found


def check_build_requirements(folders: list[Path]) -> None:
    """SystemExit naming what to install when this environment lacks a project's build requirement."""
    from build import check_dependency

    missing = [unmet[-1] for requirement in build_requirements(folders) for unmet in check_dependency(requirement)]
    if missing:
        raise SystemExit(f"the build needs {', '.join(missing)} in this environment ({sys.executable}); install "
                         f"with: {sys.executable} -m pip install {' '.join(repr(m) for m in missing)}")


def source_epoch() -> int:
    """``$SOURCE_DATE_EPOCH``, else the last commit's time, else :data:`DEFAULT_EPOCH`."""
    if os.environ.get("SOURCE_DATE_EPOCH", "").strip():
        return int(os.environ["SOURCE_DATE_EPOCH"])
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=ROOT, capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip()
        return int(out) if out else DEFAULT_EPOCH
    except (OSError, subprocess.SubprocessError, ValueError):
        return DEFAULT_EPOCH


def copy_project(source: Path, target: Path) -> Path:
    anywhere = shutil.ignore_patterns(*NOT_SOURCE)

    def ignore(folder: str, names: list[str]) -> set[str]:
        ignored = set(anywhere(folder, names))
        if Path(folder).resolve() == ROOT:
            ignored.update(n for n in names if n in CORE_SKIP)
        return ignored

    shutil.copytree(source, target, ignore=ignore)
    return target


def normalize_sdist(path: Path, epoch: int) -> None:
    """Rewrite an sdist with sorted entries, fixed times and owners, and a fixed gzip header."""
    with tarfile.open(path, "r:gz") as src:
        members = [(m, src.extractfile(m).read() if m.isfile() else None) for m in src.getmembers()]  # type: ignore[union-attr]
    members.sort(key=lambda item: item[0].name)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for member, data in members:
            member.mtime = epoch
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            member.mode = 0o755 if member.isdir() or member.mode & 0o111 else 0o644
            member.pax_headers = {}
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    with path.open("wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=epoch) as gz:
        gz.write(raw.getvalue())


def build(outdir: Path, only: list[str] | None = None, *, quiet: bool = False) -> list[Path]:
    """Build the selected projects' wheels and sdists into ``outdir``; return the files built.

    A relative ``outdir`` is the caller's (this process's working directory), never the build's: each
    project is built from a temporary folder."""
    outdir = Path(os.path.abspath(outdir))
    outdir.mkdir(parents=True, exist_ok=True)
    epoch = source_epoch()
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "PYTHONHASHSEED": "0"}
    selected = {name: path for name, path in projects().items() if not only or name in only}
    unknown = set(only or ()) - set(selected)
    if unknown:
        raise SystemExit(f"unknown project(s) {', '.join(sorted(unknown))}; projects: {', '.join(projects())}")
    check_build_requirements(list(selected.values()))
    built: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="scaffold-dist-") as tmp:
        for name, source in selected.items():
            copy = copy_project(source, Path(tmp) / name)
            before = set(outdir.iterdir())
            proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check",
                                   "--sdist", "--wheel",
                                   "--outdir", str(outdir), str(copy)], cwd=tmp, env=env, capture_output=True,
                                  text=True, timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"building {name} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
            new = sorted(set(outdir.iterdir()) - before)
            for path in new:
                if path.name.endswith(".tar.gz"):
                    normalize_sdist(path, epoch)
            built += new
            if not quiet:
                print(f"built {name}: {', '.join(p.name for p in new)}")
    sums = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(outdir.iterdir()) if p.suffix in (".whl", ".gz")}
    (outdir / "SHA256SUMS").write_text("".join(f"{digest}  {name}\n" for name, digest in sums.items()))
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outdir", default=str(ROOT / "dist"),
                        help="where the files go, relative to the current directory (default: the checkout's dist/)")
    parser.add_argument("--only", default="", help="comma-separated distributions (default: all)")
    parser.add_argument("--clean", action="store_true", help="empty the output folder first")
    args = parser.parse_args(argv)
    outdir = Path(os.path.abspath(args.outdir))  # against the caller's directory, as `--outdir dist` reads
    if args.clean and outdir.exists():
        shutil.rmtree(outdir)
    only = [n.strip() for n in args.only.split(",") if n.strip()] or None
    build(outdir, only)
    print(f"SOURCE_DATE_EPOCH={source_epoch()}; checksums in {outdir / 'SHA256SUMS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
