"""The first code the ``python`` tool's child process runs (``python -I -S ... sandbox_boot.py CONFIG``).

Under bubblewrap it runs inside the jail (see :mod:`scaffold_tools.jail`), as an unprivileged user,
from the jail root's copy of this file; with ``isolation: none`` it runs as a plain child process. In
the program's working directory, before the program, it:

1. closes every file descriptor but stdin, stdout and stderr;
2. lowers the resource limits (CPU seconds, address space, file size, open files, core dumps and, in
   the jail, processes): in the jail this process is the PID namespace's first, so every process of the
   jail inherits them; then it writes one byte on the parent's "ready" pipe and closes it, so that the
   parent tells a failure of this set-up from the program's own (which the program cannot fake);
3. puts the allowed site-packages folders on ``sys.path`` (their ``.pth`` files are not run);
4. installs an audit hook (PEP 578), the second layer behind the jail: only modules of the standard
   library (less :data:`DENIED_MODULES`) and of the allowed site-packages may be imported, and
   network sockets, starting processes, signalling other processes, writing or deleting files outside
   the working directory, reading other processes' ``/proc`` entries, raising resource limits,
   tracing and replacing code are refused. The hook keeps its policy in its own closure, with the
   builtins it uses bound when it is made, so rebinding module globals or builtins does not change it;
5. runs ``main.py`` as ``__main__``, printing the value of a final bare expression when asked
   (like a notebook cell), and maps a ``MemoryError`` to exit status :data:`EXIT_MEMORY`.

An audit hook is not a security boundary (CPython says so): native code and interpreter tricks can get
past it. The jail is the boundary; the hook makes the common mistakes fail early with a clear message.

This file imports only the standard library and must keep working under ``-I -S``; the parent
imports it only for :data:`DENIED_MODULES`, the config's encoding and the exit statuses. It is run
compiled (``python boot.pyc``): a script given as source is compiled again at every start.
"""

import os
import sys

#: Exit status when the program ran out of its memory limit.
EXIT_MEMORY = 113
#: Exit status when the sandbox itself could not be set up (bad config).
EXIT_SETUP = 114

#: Modules a program may never import: ways around the audit hook (ctypes, subinterpreters, the C-API
#: test modules), C-level file writers nobody needs without a terminal (readline), and the GUI. The jail
#: root leaves their files out too, so under bubblewrap they are not there to be loaded at all.
DENIED_MODULES = frozenset({
    "ctypes", "_ctypes", "_ctypes_test", "_testcapi", "_testinternalcapi", "_testbuffer", "_testclinic",
    "_testimportmultiple", "_testmultiphase", "_testsinglephase", "_xxsubinterpreters", "_xxinterpchannels",
    "_xxtestfuzz", "_interpreters", "_interpchannels", "_interpqueues", "xxlimited", "xxlimited_35", "xxsubtype",
    "readline", "_tkinter", "tkinter",
})
#: Without the jail, importing this is refused too: calling it directly starts processes without the
#: ``subprocess.Popen`` event. In the jail, processes are bounded by the kernel (``RLIMIT_NPROC``, and
#: nothing to run but the interpreter) and ``subprocess`` imports it (so ``asyncio`` does).
UNJAILED_DENIED = frozenset({"_posixsubprocess"})

def _limit(kind, soft, hard=None):
    import resource

    current_soft, current_hard = resource.getrlimit(kind)
    hard = soft if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        hard = min(hard, current_hard)
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def _set_limits(cfg):
    import _signal  # not signal: its enum import costs milliseconds at every call
    import resource

    cpu = int(cfg["cpu_seconds"])
    _limit(resource.RLIMIT_CPU, cpu, cpu + 1)  # SIGXCPU at the soft limit, SIGKILL a second later
    _limit(resource.RLIMIT_AS, int(cfg["memory_bytes"]))
    _limit(resource.RLIMIT_FSIZE, int(cfg["file_bytes"]))
    _limit(resource.RLIMIT_NOFILE, int(cfg["max_open_files"]))
    _limit(resource.RLIMIT_CORE, 0)
    if cfg.get("max_processes") is not None:
        _limit(resource.RLIMIT_NPROC, int(cfg["max_processes"]))
    # A write past RLIMIT_FSIZE then fails with OSError (EFBIG) instead of killing the process.
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)


_PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
                   "subprocess.Popen", "pty.spawn")
_NETWORK_EVENTS = ("socket.bind", "socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
                   "socket.gethostbyaddr", "socket.gethostname", "socket.getnameinfo", "socket.getservbyname",
                   "socket.getservbyport", "socket.sendmsg", "socket.sendto", "socket.sethostname")
#: Events that change the file system: event -> (positions of path arguments, positions of dir_fd
#: arguments). A path must resolve inside the working directory; a dir_fd must not be given.
_PATH_EVENTS = {
    "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)), "os.link": ((0, 1), (2, 3)), "os.truncate": ((0,), ()),
    "os.mkfifo": ((0,), (2,)), "os.mknod": ((0,), (3,)), "shutil.rmtree": ((0,), (1,)),
    "sqlite3.connect": ((0,), ()),
}
#: Events that change metadata, as above; a file descriptor in place of the path is refused too (an
#: fd opened for reading outside the working directory could otherwise be changed).
_META_EVENTS = {
    "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.utime": ((0,), (3,)),
    "os.setxattr": ((0,), ()), "os.removexattr": ((0,), ()), "os.chflags": ((0,), ()),
}
#: Refused outright: introspection that reaches the hook's frames or every object, tracing (which
#: writes frame locals back), limits, and replacing a function's code.
_REFUSED_EVENTS = {
    "gc.get_objects": "gc.get_objects is disabled", "gc.get_referrers": "gc.get_referrers is disabled",
    "gc.get_referents": "gc.get_referents is disabled", "sys.settrace": "tracing is disabled",
    "sys.setprofile": "profiling hooks are disabled", "resource.setrlimit": "changing resource limits is not allowed",
    "resource.prlimit": "changing resource limits is not allowed",
}
_ALLOWED_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/stdout", "/dev/stderr", "/dev/tty")


def importable(stdlib_names, site_dirs, denied):
    """Top-level module names a program may import: the standard library and the site-packages' contents."""
    names = set(stdlib_names)
    for folder in site_dirs:
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            if entry.endswith((".dist-info", ".egg-info", ".pth", ".data")) or "-" in entry.split(".")[0]:
                continue
            names.add(entry.split(".", 1)[0])
    return frozenset(names - set(denied))


class _ByIdentity:
    """``x in it``: whether ``x`` is one of the given objects (not merely equal to one)."""

    __slots__ = ("_ids",)

    def __init__(self, objects):
        self._ids = frozenset(id(o) for o in objects)

    def __contains__(self, item):
        return id(item) in self._ids


def _file_guards(workdir):
    """Handlers of the events that open, change or link files: nothing may change outside ``workdir``."""
    fspath, fsdecode, getcwd = os.fspath, os.fsdecode, os.getcwd
    join, realpath, dirname, isdir = os.path.join, os.path.realpath, os.path.dirname, os.path.isdir
    isinstance_, len_, any_, int_, str_, bytes_ = isinstance, len, any, int, str, bytes
    refuse_error = PermissionError
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    prefix = workdir.rstrip(os.sep) + os.sep
    own_pid = str(os.getpid())
    devices = frozenset(_ALLOWED_DEVICES)
    path_events, meta_events = dict(_PATH_EVENTS), dict(_META_EVENTS)
    no_dir_fd, memory_dbs = (None, -1, -100), ("", ":memory:")

    def resolve(path, base=None):
        text = fspath(path)
        if isinstance_(text, bytes_):
            text = fsdecode(text)
        return realpath(join(base if base is not None else getcwd(), text))

    def outside(full):
        return not (full == workdir or full.startswith(prefix)) and full not in devices

    def refuse_outside(event, path, base=None):
        if not isinstance_(path, int_) and outside(resolve(path, base)):
            raise refuse_error(f"sandbox: {event} of {resolve(path, base)!r} is not allowed; the program may only "
                               f"change files in its working directory {workdir!r}")

    def refuse_dir_fd(event, args, positions):
        for i in positions:
            if i < len_(args) and args[i] not in no_dir_fd:
                raise refuse_error(f"sandbox: {event} with dir_fd is not allowed; pass a path")

    def on_open(event, args):
        path, mode, flags = args
        if isinstance_(path, int_) or path is None:
            return
        full = resolve(path)
        if (isinstance_(mode, str_) and any_(c in mode for c in "wax+")) or (
                isinstance_(flags, int_) and flags & write_flags):
            if outside(full):
                raise refuse_error(f"sandbox: writing {full!r} is not allowed; the program may only write files in "
                                   f"its working directory {workdir!r}")
            return
        if full.startswith("/proc/"):  # /proc/<pid>/... of another process (environment, memory, command line)
            head = full[6:].split("/", 1)[0]
            if head.isdigit() and head != own_pid:
                raise refuse_error(f"sandbox: reading {full!r} (another process) is not allowed")
        if mode is None and outside(full) and isdir(full):  # a folder's fd could be passed as dir_fd
            raise refuse_error(f"sandbox: opening the directory {full!r} as a file descriptor is not allowed")

    def on_path(event, args):
        paths, dir_fds = path_events[event]
        refuse_dir_fd(event, args, dir_fds)
        for i in paths:
            if not (event == "sqlite3.connect" and args[i] in memory_dbs):
                refuse_outside(event, args[i])

    def on_meta(event, args):
        paths, dir_fds = meta_events[event]
        refuse_dir_fd(event, args, dir_fds)
        for i in paths:
            if isinstance_(args[i], int_):
                raise refuse_error(f"sandbox: {event} on a file descriptor is not allowed")
            refuse_outside(event, args[i])

    def on_symlink(event, args):
        refuse_dir_fd(event, args, (2,))
        refuse_outside(event, args[1])
        refuse_outside(event, args[0], base=dirname(resolve(args[1])))

    handlers = {"open": on_open, "os.symlink": on_symlink}
    handlers.update(dict.fromkeys(path_events, on_path))
    handlers.update(dict.fromkeys(meta_events, on_meta))
    return handlers


def _other_guards(allowed, denied):
    """Handlers of imports (the allow-list), signals, sockets and code replacement."""
    getpid, getpgrp = os.getpid, os.getpgrp
    isinstance_, len_, str_, getattr_ = isinstance, len, str, getattr
    refuse_error, import_error = PermissionError, ImportError
    allowed, denied = frozenset(allowed), frozenset(denied)
    unix_family = 1  # socket.AF_UNIX on every POSIX system
    protected = _ByIdentity([vars(sys.modules[name]) for name in ("os", "posixpath", "genericpath", "stat")
                             if name in sys.modules] + [globals()])

    def on_import(event, args):
        name = args[0]
        parts = name.split(".") if isinstance_(name, str_) else [name]
        for part in parts:  # also "json._ctypes": an extension module's init function is named by the last part
            if part in denied:
                raise import_error(f"sandbox: importing {part} is disabled")
        if parts[0] not in allowed and not parts[0].startswith("_sysconfigdata"):
            raise import_error(f"sandbox: importing {parts[0]} is not allowed: only the standard library and the "
                               "allowed site-packages can be imported (the python tool's site_packages option)")

    def on_kill(event, args):
        if args[0] not in (0, getpid(), getpgrp(), -getpgrp()):
            raise refuse_error("sandbox: signalling other processes is not allowed")

    def on_socket(event, args):
        # A pair of connected local sockets (what asyncio's event loop makes to wake itself) reaches nothing;
        # every other socket is refused, and so is connecting or binding any socket (a local one too).
        if len_(args) < 2 or args[1] != unix_family:
            raise refuse_error("sandbox: network access is disabled")

    def on_setattr(event, args):
        # Replacing the code of a function the hook calls (os.path's, this file's) would change what it checks;
        # other functions' code may change (types.coroutine does, so asyncio imports).
        if len_(args) > 1 and args[1] == "__code__" and getattr_(args[0], "__globals__", None) in protected:
            raise refuse_error("sandbox: replacing the code of the sandbox's own functions is disabled")

    return {"import": on_import, "os.kill": on_kill, "os.killpg": on_kill, "object.__setattr__": on_setattr,
            "socket.__new__": on_socket}


def _make_hook(workdir, allowed, denied):
    """The audit hook. Everything it uses is bound in its closures: rebinding this module's globals or the
    builtins afterwards changes nothing."""
    refuse_error = PermissionError
    process_events, network_events = frozenset(_PROCESS_EVENTS), frozenset(_NETWORK_EVENTS)
    refused_events = dict(_REFUSED_EVENTS)
    handlers = {**_file_guards(workdir), **_other_guards(allowed, denied)}
    get = handlers.get

    def hook(event, args):
        handler = get(event)
        if handler is not None:
            handler(event, args)
        elif event in network_events:
            raise refuse_error("sandbox: network access is disabled")
        elif event in process_events:
            raise refuse_error("sandbox: starting processes is disabled")
        elif event in refused_events:
            raise refuse_error(f"sandbox: {refused_events[event]}")

    return hook


def _compile(source, print_last):
    import _ast  # not ast: its imports (enum, contextlib) cost milliseconds at every call

    tree = compile(source, "main.py", "exec", _ast.PyCF_ONLY_AST)
    last = None
    if print_last and tree.body and isinstance(tree.body[-1], _ast.Expr):
        last = _ast.Expression(body=tree.body.pop().value)
        last = compile(last, "main.py", "eval")
    return compile(tree, "main.py", "exec"), last


def _print_exception(exc):
    import traceback

    report = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    seen = set()
    todo = [report]
    while todo:  # the program's frames only: drop this file's (the setup and the audit hook)
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        item.stack = traceback.StackSummary.from_list([f for f in item.stack if f.filename != _THIS_FILE])
        todo += [e for e in (item.__cause__, item.__context__) if e is not None]
    sys.stderr.write("".join(report.format()))
    sys.stderr.flush()


def _close_inherited_fds(keep=-1):
    """Close every descriptor but stdin, stdout, stderr and ``keep`` (nothing of the parent's stays reachable)."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        fds = range(3, 1024)
    for fd in fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _setup(cfg):
    """Limits, sys.path and the program's source; returns (workdir, source)."""
    _close_inherited_fds(keep=cfg.get("ready_fd", -1))
    workdir = os.path.realpath(os.getcwd())
    _set_limits(cfg)
    sys.path.extend(cfg.get("site_packages") or ())
    with open("main.py", encoding="utf-8") as f:
        source = f.read()
    return workdir, source


def decode_config(text):
    """The config the parent passed (:func:`encode_config`): marshal, which needs no import, in hex."""
    import marshal

    return marshal.loads(bytes.fromhex(text))


def encode_config(config):
    """The text :func:`decode_config` reads (marshal format 4, which every Python 3 since 3.4 reads)."""
    import marshal

    return marshal.dumps(config, 4).hex()


def _say_ready(fd):
    """Tell the parent, on a pipe the program never sees, that what follows is the program's doing."""
    if fd >= 0:
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)


def main():
    try:
        cfg = decode_config(sys.argv[1])
        workdir, source = _setup(cfg)
        _say_ready(cfg.get("ready_fd", -1))
    except Exception as exc:  # a bug in the parent's setup, not the program's fault
        sys.stderr.write(f"sandbox setup failed: {type(exc).__name__}: {exc}\n")
        return EXIT_SETUP
    sys.argv = ["main.py"]
    program = type(sys)("__main__")
    program.__file__ = "main.py"
    sys.modules["__main__"] = program  # the program's __main__, not this file
    namespace = program.__dict__
    try:
        body, last = _compile(source, cfg.get("print_last_expression", True))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        import traceback

        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        return 1
    if cfg.get("audit_hook", True):
        denied = DENIED_MODULES if cfg.get("jailed") else DENIED_MODULES | UNJAILED_DENIED
        allowed = importable(sys.stdlib_module_names, cfg.get("site_packages") or (), denied)
        sys.addaudithook(_make_hook(workdir, allowed, denied))
    return _run(body, last, namespace, cfg)


def _run(body, last, namespace, cfg):
    try:
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                print(repr(value))
    except SystemExit:
        raise
    except MemoryError:
        sys.stderr.write(f"MemoryError: the program exceeded its memory limit of {cfg['memory_mb']} MiB\n")
        return EXIT_MEMORY
    except BaseException as exc:
        _print_exception(exc)
        return 1
    return 0


#: What tracebacks call this file (its source path, or the name it was compiled under).
_THIS_FILE = _print_exception.__code__.co_filename

if __name__ == "__main__":
    sys.exit(main())
