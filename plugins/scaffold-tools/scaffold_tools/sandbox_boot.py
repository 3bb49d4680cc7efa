"""The first code the ``python`` tool's child process runs (``python -I ... sandbox_boot.py CONFIG``).

It runs in the program's private working directory, before the program, and:

1. lowers the resource limits (CPU seconds, address space, file size, open files, core dumps and,
   where the kernel enforces it, processes);
2. installs an audit hook (PEP 578) that refuses network sockets, starting processes, signalling
   other processes, writing or deleting files outside the working directory, reading other
   processes' ``/proc`` entries, raising resource limits, and importing ``ctypes`` or
   ``_posixsubprocess`` (the usual ways around the hook);
3. runs ``main.py`` as ``__main__``, printing the value of a final bare expression when asked
   (like a notebook cell), and maps a ``MemoryError`` to exit status :data:`EXIT_MEMORY`.

This file imports only the standard library and must keep working under ``-I -S``: it is not
imported by the parent (the parent only needs its path and the exit statuses below).
"""

import os
import sys

#: Exit status when the program ran out of its memory limit.
EXIT_MEMORY = 113
#: Exit status when the sandbox itself could not be set up (bad config).
EXIT_SETUP = 114

_PROCESS_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
    "subprocess.Popen", "pty.spawn",
})
_NETWORK_EVENTS = frozenset({
    "socket.__new__", "socket.bind", "socket.connect", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyaddr", "socket.gethostname", "socket.getnameinfo", "socket.getservbyname",
    "socket.getservbyport", "socket.sendmsg", "socket.sendto", "socket.sethostname",
})
_BLOCKED_IMPORTS = frozenset({"ctypes", "_ctypes", "_posixsubprocess"})
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
_NO_DIR_FD = (None, -1, -100)
_IN_MEMORY_DATABASES = ("", ":memory:")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _limit(kind, soft, hard=None):
    import resource

    current_soft, current_hard = resource.getrlimit(kind)
    hard = soft if hard is None else hard
    if current_hard != resource.RLIM_INFINITY:
        hard = min(hard, current_hard)
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def _set_limits(cfg):
    import resource
    import signal

    cpu = int(cfg["cpu_seconds"])
    _limit(resource.RLIMIT_CPU, cpu, cpu + 1)  # SIGXCPU at the soft limit, SIGKILL a second later
    _limit(resource.RLIMIT_AS, int(cfg["memory_bytes"]))
    _limit(resource.RLIMIT_FSIZE, int(cfg["file_bytes"]))
    _limit(resource.RLIMIT_NOFILE, int(cfg["max_open_files"]))
    _limit(resource.RLIMIT_CORE, 0)
    if cfg.get("max_processes") is not None:
        _limit(resource.RLIMIT_NPROC, int(cfg["max_processes"]))
    # A write past RLIMIT_FSIZE then fails with OSError (EFBIG) instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _make_hook(workdir):
    fspath, fsdecode, getcwd = os.fspath, os.fsdecode, os.getcwd
    join, realpath, dirname, isdir = os.path.join, os.path.realpath, os.path.dirname, os.path.isdir
    prefix = workdir.rstrip(os.sep) + os.sep
    own_pid = str(os.getpid())
    allowed_devices = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/stdout",
                                 "/dev/stderr", "/dev/tty"})

    def resolve(path, base=None):
        text = fspath(path)
        if isinstance(text, bytes):
            text = fsdecode(text)
        return realpath(join(base if base is not None else getcwd(), text))

    def inside(full):
        return full == workdir or full.startswith(prefix)

    def refuse_outside(event, path, base=None):
        if isinstance(path, int):
            return
        full = resolve(path, base)
        if not inside(full) and full not in allowed_devices:
            raise PermissionError(
                f"sandbox: {event} of {full!r} is not allowed; the program may only change files in "
                f"its working directory {workdir!r}")

    def refuse_dir_fd(event, args, positions):
        for i in positions:
            if i < len(args) and args[i] not in _NO_DIR_FD:
                raise PermissionError(f"sandbox: {event} with dir_fd is not allowed; pass a path")

    def refuse_foreign_proc(full):
        # /proc/<pid>/... of another process (its environment, memory, command line).
        if full.startswith("/proc/"):
            head = full[6:].split("/", 1)[0]
            if head.isdigit() and head != own_pid:
                raise PermissionError(f"sandbox: reading {full!r} (another process) is not allowed")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int) or path is None:
                return
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            full = resolve(path)
            if writing:
                if not inside(full) and full not in allowed_devices:
                    raise PermissionError(
                        f"sandbox: writing {full!r} is not allowed; the program may only write files in its "
                        f"working directory {workdir!r}")
                return
            refuse_foreign_proc(full)
            if mode is None and not inside(full) and isdir(full):
                # os.open of a directory: its fd could be passed as dir_fd to write outside.
                raise PermissionError(
                    f"sandbox: opening the directory {full!r} as a file descriptor is not allowed")
        elif event in _NETWORK_EVENTS:
            raise PermissionError("sandbox: network access is disabled")
        elif event in _PROCESS_EVENTS:
            raise PermissionError("sandbox: starting processes is disabled")
        elif event == "import":
            if args[0] in _BLOCKED_IMPORTS:
                raise ImportError(f"sandbox: importing {args[0]} is disabled")
        elif event in _PATH_EVENTS:
            paths, dir_fds = _PATH_EVENTS[event]
            refuse_dir_fd(event, args, dir_fds)
            for i in paths:
                if event == "sqlite3.connect" and args[i] in _IN_MEMORY_DATABASES:
                    continue
                refuse_outside(event, args[i])
        elif event in _META_EVENTS:
            paths, dir_fds = _META_EVENTS[event]
            refuse_dir_fd(event, args, dir_fds)
            for i in paths:
                if isinstance(args[i], int):
                    raise PermissionError(f"sandbox: {event} on a file descriptor is not allowed")
                refuse_outside(event, args[i])
        elif event == "os.symlink":
            src, dst = args[0], args[1]
            refuse_dir_fd(event, args, (2,))
            refuse_outside(event, dst)
            refuse_outside(event, src, base=dirname(resolve(dst)))
        elif event in ("os.kill", "os.killpg"):
            target = args[0]
            if target not in (0, os.getpid(), os.getpgrp(), -os.getpgrp()):
                raise PermissionError("sandbox: signalling other processes is not allowed")
        elif event in ("resource.setrlimit", "resource.prlimit"):
            raise PermissionError("sandbox: changing resource limits is not allowed")
        elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents"):
            raise PermissionError(f"sandbox: {event} is disabled")
        elif event == "object.__setattr__" and len(args) > 1 and args[1] == "__code__":
            raise PermissionError("sandbox: replacing a function's code is disabled")

    return hook


def _compile(source, print_last):
    import ast

    tree = ast.parse(source, filename="main.py", mode="exec")
    last = None
    if print_last and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(body=tree.body.pop().value)
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
        item.stack = traceback.StackSummary.from_list([f for f in item.stack if f.filename != __file__])
        todo += [e for e in (item.__cause__, item.__context__) if e is not None]
    sys.stderr.write("".join(report.format()))
    sys.stderr.flush()


def main():
    import json

    try:
        cfg = json.loads(sys.argv[1])
        workdir = os.path.realpath(os.getcwd())
        _set_limits(cfg)
        with open("main.py", encoding="utf-8") as f:
            source = f.read()
    except Exception as exc:  # a bug in the parent's setup, not the program's fault
        sys.stderr.write(f"sandbox setup failed: {type(exc).__name__}: {exc}\n")
        return EXIT_SETUP
    import types

    sys.argv = ["main.py"]
    program = types.ModuleType("__main__")
    program.__file__ = "main.py"
    sys.modules["__main__"] = program  # the program's __main__, not this file
    namespace = program.__dict__
    try:
        body, last = _compile(source, cfg.get("print_last_expression", True))
    except (SyntaxError, ValueError) as exc:
        import traceback

        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        return 1
    sys.addaudithook(_make_hook(workdir))
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


if __name__ == "__main__":
    sys.exit(main())
