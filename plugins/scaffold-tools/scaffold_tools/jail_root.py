"""The read-only root of the python tool's jail: the Python runtime, and nothing else.

bubblewrap shows the jail host folders by bind-mounting them. Binding the runtime's own folders
would show everything beside it (the interpreter's site-packages, its test suite), and it fails when
the jail is entered as an unprivileged user that cannot reach them (a pyenv under ``/root``, mode
0700). So the runtime is assembled once into a folder of its own, the *jail root*, holding copies (never
hard links: a hard link is the host's own file, whose reads an inotify watch or access times would show
inside) of exactly:

* the interpreter a program runs on (a venv's ``python`` resolved to the interpreter it was made from);
* its standard library, without the test suite, ``site-packages``, tkinter, IDLE, ensurepip, the build
  configuration, and without the modules the sandbox refuses (:data:`sandbox_boot.DENIED_MODULES`:
  ctypes, subinterpreters, the C-API test modules, readline): they are not there to be loaded;
* the shared libraries those load, as ``ldd`` resolves them, with the symbolic links on the way
  (``/lib -> usr/lib``), and ``libgcc_s`` (which glibc loads when a thread exits);
* the sandbox's boot file, compiled by the runtime's interpreter, at :data:`BOOT_PATH` (a script given as
  source is compiled at every start: a third of a call's cost);
* empty folders where the allowed site-packages are mounted.

Every file sits at its own absolute path under the root, so the interpreter finds its library as it
would outside. The folder is named by a hash of what it holds (paths, sizes, modification times of
the library and of the site-packages' extension modules); a ``manifest.json`` in it lists the shared
libraries with theirs, checked at every start (about 30 ms). A changed runtime gets a new root; an
unchanged one is reused across runs and processes. It lives in ``$SCAFFOLD_CACHE_DIR/python-jail``
(default ``~/.cache/scaffold/python-jail``) or, when that is not reachable by the jail's user (root's
home), in ``/var/cache/scaffold/python-jail``; that folder is readable only by its owner and, when
scaffold runs as root, the jail's group (65534), never by other users.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import sandbox_boot
from .sandbox_boot import DENIED_MODULES

BOOT_SOURCE = Path(sandbox_boot.__file__)
#: Where the compiled boot file is inside the jail (the interpreter runs a ``.pyc`` given as the script).
BOOT_PATH = "/scaffold-sandbox/boot.pyc"
COMPILE = ("import py_compile, sys\n"
           "py_compile.compile(sys.argv[1], cfile=sys.argv[2], dfile=sys.argv[3], doraise=True,\n"
           "                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n")
#: Bumped when what goes into a root changes (not when the runtime does: that changes the hash by itself).
LAYOUT_VERSION = 3
#: Top-level entries of the standard library that stay out: tests, third-party packages, GUI, build files.
STDLIB_LEFT_OUT = frozenset({"test", "site-packages", "dist-packages", "idlelib", "tkinter", "turtledemo",
                             "turtle.py", "ensurepip", "lib2to3", "pydoc_data",
                             # never run under -S; Debian's is a link into /etc
                             "sitecustomize.py", "usercustomize.py"})
#: Jail roots kept per cache folder; beyond that the least recently used go (never one used in the last hour).
KEEP_ROOTS = 8
#: Shared libraries that are loaded at run time rather than linked (so ``ldd`` does not list them).
DLOPENED = ("libgcc_s.so.1",)
QUERY = ("import json, os, sys\n"
         "exe = getattr(sys, '_base_executable', None) or sys.executable\n"
         "print(json.dumps({'executable': os.path.realpath(exe), 'version': '%d.%d' % sys.version_info[:2],\n"
         "                  'paths': [p for p in sys.path if p and os.path.exists(p)],\n"
         "                  'stdlib_names': sorted(getattr(sys, 'stdlib_module_names', ()))}))\n")
SITE_QUERY = "import json, site\nprint(json.dumps(site.getsitepackages()))\n"


class JailRootError(RuntimeError):
    """The runtime cannot be assembled (an interpreter that does not run, an unreadable library)."""


@dataclass(frozen=True)
class Runtime:
    """An interpreter as the jail runs it: ``python -I -S`` with ``paths`` (its standard library) on sys.path."""

    executable: str
    version: str
    paths: tuple[str, ...]
    stdlib_names: tuple[str, ...] = ()
    site_packages: tuple[str, ...] = ()


def _query(python: str, code: str, flags: Sequence[str]) -> object:
    try:
        proc = subprocess.run([python, *flags, "-c", code], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        raise JailRootError(f"the interpreter {python} does not run: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
        raise JailRootError(f"the interpreter {python} failed to describe itself: {last}")
    return json.loads(proc.stdout)


def describe_runtime(python: str, site_packages: bool | Sequence[str] = False) -> Runtime:
    """The runtime of ``python`` (an interpreter or a venv's), and the site-packages the jail may import.

    ``site_packages``: False (none), True (the interpreter's own, e.g. a venv's), or a list of folders.
    """
    info = _query(python, QUERY, ("-I", "-S"))
    assert isinstance(info, dict)
    if site_packages is True:
        found = _query(python, SITE_QUERY, ("-I",))
        dirs = [str(p) for p in found] if isinstance(found, list) else []
    elif site_packages:
        dirs = [str(p) for p in site_packages]
    else:
        dirs = []
    real = tuple(dict.fromkeys(os.path.realpath(d) for d in dirs if os.path.isdir(d)))
    return Runtime(executable=info["executable"], version=info["version"], paths=tuple(info["paths"]),
                   stdlib_names=tuple(info["stdlib_names"]), site_packages=real)


def compile_boot(python: str, target: Path, shown_as: str) -> None:
    """Compile the boot file with ``python`` (its own bytecode version) into ``target``; tracebacks call it
    ``shown_as``."""
    try:
        proc = subprocess.run([python, "-I", "-S", "-c", COMPILE, str(BOOT_SOURCE), str(target), shown_as],
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        raise JailRootError(f"the interpreter {python} could not compile the sandbox's boot file: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
        raise JailRootError(f"the interpreter {python} could not compile the sandbox's boot file: {last}")


def module_of(filename: str) -> str:
    """The module a file in the standard library defines: ``_ctypes.cpython-311-x86_64-linux-gnu.so`` -> ``_ctypes``."""
    return filename.split(".", 1)[0]


# -- what goes in ----------------------------------------------------------------------------------


@dataclass
class _Plan:
    """Jail paths -> what they are: a file (its host source), a symbolic link (its target) or a folder."""

    files: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)

    def add(self, path: str, left_out: Iterable[str] = (), _depth: int = 0) -> str:
        """``path`` as the host resolves it: every symbolic link on the way is kept as a link, and what it
        finally names (a file, or a whole folder less the top-level names in ``left_out``) is added.
        Returns the resolved path."""
        if _depth > 40:
            raise JailRootError(f"too many symbolic links resolving {path}")
        parts = [p for p in os.path.normpath(path).split("/") if p]
        head = "/"
        for i, part in enumerate(parts):
            candidate = os.path.join(head, part)
            if os.path.islink(candidate):
                target = os.readlink(candidate)
                self.links[candidate] = target
                resolved = os.path.normpath(os.path.join(head, target))
                return self.add(os.path.join(resolved, *parts[i + 1:]), left_out, _depth + 1)
            head = candidate
        if os.path.isdir(head):
            self.add_tree(head, left_out)
        elif os.path.isfile(head):
            self.files[head] = head
        else:
            raise JailRootError(f"{head} is neither a file nor a folder")
        return head

    def add_tree(self, top: str, left_out: Iterable[str] = ()) -> None:
        skip = set(left_out)
        for folder, subdirs, names in os.walk(top):
            if folder == top:
                subdirs[:] = [d for d in subdirs if d not in skip]
                names = [n for n in names if n not in skip]
            self.dirs.add(folder)
            for name in names:
                if module_of(name) in DENIED_MODULES and name.endswith((".so", ".py", ".pyc")):
                    continue
                full = os.path.join(folder, name)
                if os.path.islink(full):
                    self.add(full)
                elif os.path.isfile(full):
                    self.files[full] = full
            for name in list(subdirs):
                full = os.path.join(folder, name)
                if name in DENIED_MODULES:
                    subdirs.remove(name)
                elif os.path.islink(full):
                    subdirs.remove(name)
                    self.add(full)


def _stdlib_plan(runtime: Runtime, copied_site_packages: Sequence[str]) -> _Plan:
    plan = _Plan()
    for folder in copied_site_packages:
        plan.add(folder)
    plan.add(runtime.executable)
    walked: list[str] = []
    for path in runtime.paths:
        real = os.path.realpath(path)
        if any(real.startswith(top + "/") for top in walked):
            continue  # lib-dynload inside the library folder: already there
        if os.path.isdir(real):
            walked.append(real)
            left_out = STDLIB_LEFT_OUT | {n for n in os.listdir(real) if n.startswith("config-")}
            plan.add(path, left_out)
        else:
            plan.add(path)
    return plan


def _extension_files(runtime: Runtime, plan: _Plan, bound_site_packages: Sequence[str]) -> list[str]:
    """The executable and every shared object the jail can load (standard library and site-packages)."""
    found = [runtime.executable] + [f for f in plan.files if ".so" in os.path.basename(f)]
    for top in bound_site_packages:
        for folder, _subdirs, names in os.walk(top):
            found += [os.path.join(folder, n) for n in names if n.endswith(".so") or ".so." in n]
    return found


def _fingerprint(runtime: Runtime, plan: _Plan, extensions: Sequence[str], bound: Sequence[str]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps([LAYOUT_VERSION, runtime.executable, runtime.paths, runtime.site_packages, list(bound),
                              sorted(DENIED_MODULES), BOOT_SOURCE.read_bytes().hex()]).encode())
    for path in sorted(set(plan.files) | set(extensions)):
        st = os.stat(path)
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    for path in sorted(plan.links):
        digest.update(f"{path}\0{plan.links[path]}\n".encode())
    return digest.hexdigest()[:24]


def _ldd(path: str) -> list[str]:
    """The shared libraries ``path`` needs, as the loader finds them (absolute paths)."""
    try:
        proc = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in proc.stdout.splitlines():
        words = line.split()
        if "=>" in words:
            at = words.index("=>")
            if at + 1 < len(words) and words[at + 1].startswith("/"):
                found.append(words[at + 1])
        elif words and words[0].startswith("/"):
            found.append(words[0])  # the loader itself
    return found


def _libraries(extensions: Sequence[str]) -> list[str]:
    if shutil.which("ldd") is None:
        raise JailRootError("ldd is not installed; it finds the shared libraries the interpreter needs "
                            "(Debian/Ubuntu: apt-get install libc-bin)")
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:
        needed = sorted({lib for libs in pool.map(_ldd, extensions) for lib in libs})
    for lib in list(needed):
        if os.path.basename(lib).startswith("libc.so"):
            needed += [os.path.join(os.path.dirname(lib), name) for name in DLOPENED
                       if os.path.exists(os.path.join(os.path.dirname(lib), name))]
    return sorted(set(needed))


# -- the root on disk -------------------------------------------------------------------------------


def cache_dir(jail_uid: int | None) -> Path:
    """Where jail roots are kept: a folder the jail's user (``jail_uid``; None: this one) can reach."""
    env = os.environ.get("SCAFFOLD_CACHE_DIR")
    if env:
        base = Path(env).expanduser()
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaffold"
    if jail_uid is not None and jail_uid != os.geteuid() and not reachable_by_others(base):
        base = Path("/var/cache/scaffold")
    return base / "python-jail"


def reachable_by_others(path: str | Path, *, readable: bool = False) -> bool:
    """Whether every existing folder on the way to ``path`` lets any user pass (mode o+x); with ``readable``,
    whether ``path`` itself may also be listed by any user (o+r)."""
    current = Path(os.path.abspath(path))
    for folder in [current, *current.parents]:
        try:
            mode = folder.stat().st_mode
        except FileNotFoundError:
            continue
        if not mode & stat.S_IXOTH or (readable and folder == current and not mode & stat.S_IROTH):
            return False
    return True


@dataclass(frozen=True)
class JailRoot:
    """An assembled root: ``path`` on the host; ``entries`` its top-level names (each bound into the jail)."""

    path: Path
    runtime: Runtime
    #: The site-packages bound into the jail at their own paths (the others, which the jail's user cannot
    #: reach, are copied into the root).
    bound_site_packages: tuple[str, ...] = ()

    def entries(self) -> list[tuple[str, str | None]]:
        """(name, link target or None for a folder) of each top-level entry but the manifest."""
        out = []
        for entry in sorted(os.listdir(self.path)):
            if entry == "manifest.json":
                continue
            full = self.path / entry
            out.append((entry, os.readlink(full) if full.is_symlink() else None))
        return out


def _manifest_fresh(root: Path) -> bool:
    try:
        manifest = json.loads((root / "manifest.json").read_text())
        for path, (size, mtime) in manifest["libraries"].items():
            st = os.stat(path)
            if (st.st_size, st.st_mtime_ns) != (size, mtime):
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def _copy(source: str, target: str) -> None:
    """A copy of the file (its mode and times kept), never a link to it."""
    shutil.copy2(source, target, follow_symlinks=True)


def _materialize(plan: _Plan, runtime: Runtime, libraries: Sequence[str], target: Path,
                 mountpoints: Sequence[str]) -> None:
    target.mkdir(mode=0o755, parents=True)
    inside = str(target)
    for folder in sorted(plan.dirs | {os.path.dirname(f) for f in plan.files} |
                         {os.path.dirname(link) for link in plan.links} | set(mountpoints)):
        os.makedirs(inside + folder, mode=0o755, exist_ok=True)
    for link, destination in plan.links.items():
        if not os.path.lexists(inside + link):
            os.symlink(destination, inside + link)
    for path, source in plan.files.items():
        if not os.path.lexists(inside + path):
            _copy(source, inside + path)
    boot = Path(inside + BOOT_PATH)
    boot.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    compile_boot(runtime.executable, boot, BOOT_PATH)
    boot.chmod(0o644)
    stats = {lib: [os.stat(lib).st_size, os.stat(lib).st_mtime_ns] for lib in libraries}
    (target / "manifest.json").write_text(json.dumps({"runtime": runtime.executable, "libraries": stats}))
    os.chmod(target, 0o755)


def build_jail_root(runtime: Runtime, cache: Path, jail_uid: int | None = None) -> JailRoot:
    """The jail root of ``runtime`` in ``cache``: reused when up to date, else assembled (atomically).

    ``jail_uid``: the host uid the jail is entered as, when not this process's; site-packages it cannot
    reach are copied into the root instead of bound."""
    bound = tuple(sp for sp in runtime.site_packages
                  if jail_uid is None or reachable_by_others(sp, readable=True))
    plan = _stdlib_plan(runtime, [sp for sp in runtime.site_packages if sp not in bound])
    extensions = _extension_files(runtime, plan, bound)
    final = cache / _fingerprint(runtime, plan, extensions, bound)
    if final.is_dir() and _manifest_fresh(final):
        _touch(final)
        return JailRoot(final, runtime, bound)
    libraries = _libraries(extensions)
    for lib in libraries:
        plan.add(lib)
    _make_cache(cache, jail_uid)
    staging = cache / f".{final.name}.{uuid.uuid4().hex[:8]}"
    try:
        _materialize(plan, runtime, libraries, staging, bound)
        if final.exists():  # stale (a library changed): replace it
            old = cache / f".{final.name}.old.{uuid.uuid4().hex[:8]}"
            try:
                os.rename(final, old)
            except OSError:  # another process is replacing it too
                pass
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(staging, final)
        except OSError:  # another process made it meanwhile
            if not (final.is_dir() and _manifest_fresh(final)):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    prune(cache, keep=final)
    return JailRoot(final, runtime, bound)


def _make_cache(cache: Path, jail_uid: int | None) -> None:
    """The cache folder, readable only by this user and the jail's group (65534 when scaffold runs as root):
    the roots hold the runtime of a private home (a pyenv under /root) that other users must not read."""
    cache.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    cache.mkdir(mode=0o700, exist_ok=True)
    if jail_uid is not None and os.geteuid() == 0:
        os.chown(cache, 0, jail_uid)
        os.chmod(cache, 0o750)
    else:
        os.chmod(cache, 0o700)


def _touch(root: Path) -> None:
    try:
        os.utime(root / "manifest.json")
    except OSError:
        pass


def prune(cache: Path, keep: Path, limit: int = KEEP_ROOTS, idle_s: float = 3600.0) -> None:
    """Remove the least recently used roots beyond ``limit`` (by their manifest's time), sparing ``keep``
    and any used in the last ``idle_s`` seconds (another run may be using it)."""
    import time

    roots = []
    for entry in cache.iterdir():
        if entry.name.startswith(".") or entry == keep or not entry.is_dir():
            continue
        try:
            roots.append((os.stat(entry / "manifest.json").st_mtime, entry))
        except OSError:  # not a root (or one being made): not ours to remove
            continue
    roots.sort(reverse=True)
    now = time.time()
    for used, entry in roots[max(0, limit - 1):]:
        if now - used > idle_s:
            shutil.rmtree(entry, ignore_errors=True)
