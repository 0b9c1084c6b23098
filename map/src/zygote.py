# isorun map's zygote: imports the user's function once, then forks one
# process per call (or per --items-per-worker calls); it never calls the
# function itself. Started by the isorun supervisor (map/src/process.rs:
# the control messages; map/src/call.rs: a call's frames), which owns every
# process. Standard library only.
import json
import os
import select
import socket
import struct
import sys

MAX_CONTROL = 1 << 16
VALUE_JSON_MAX = 1 << 20
TRACEBACK_MAX = 1 << 16


def _send(sock, message, fds=()):
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _cuda():
    """The first CUDA library mapped into this process, or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                name = line.rsplit("/", 1)[-1].strip()
                if name.startswith(("libcuda.so", "libcudart.so", "libcudart-")):
                    return name
    except OSError:
        pass
    return None


def _error(kind, exc, skip_frames=0):
    import traceback

    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None:
            tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    if len(text) > TRACEBACK_MAX:
        text = "...\n" + text[-TRACEBACK_MAX:]
    message = "%s: %s" % (type(exc).__qualname__, exc) if str(exc) else type(exc).__qualname__
    return {"kind": kind, "message": message, "traceback": text}


def _load(spec):
    """The function, and its identity: (fn, source_sha256) or raises (kind, exc)."""
    import hashlib
    import importlib
    import importlib.util

    module_name = spec["module"]
    qualname = spec["function"]
    for name in spec.get("preload") or []:
        try:
            importlib.import_module(name)
        except BaseException as e:
            raise LoadError("no_preload", e)
    if spec.get("function_pickle"):
        import pickle

        try:
            import cloudpickle  # noqa: F401  (what pickled by-value functions need)
        except ImportError:
            pass
        try:
            with open(spec["function_pickle"], "rb") as f:
                fn = pickle.loads(f.read())
        except BaseException as e:
            raise LoadError("bad_function_pickle", e)
        if not callable(fn):
            raise LoadError("no_function", TypeError("the pickled object is a %s, not callable" % type(fn).__qualname__))
        return fn, None
    try:
        if module_name.endswith(".py") or "/" in module_name:
            path = os.path.abspath(module_name)
            name = os.path.splitext(os.path.basename(path))[0]
            sys.path.insert(0, os.path.dirname(path))
            module_spec = importlib.util.spec_from_file_location(name, path)
            if module_spec is None or not os.path.isfile(path):
                raise ModuleNotFoundError("no Python file %s" % path, name=module_name)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except BaseException as e:
        # Only the module itself (or a package above it) missing is bad
        # input; a module whose own imports fail is a failed import.
        missing = isinstance(e, ModuleNotFoundError) and (
            e.name is None or e.name == module_name or module_name.startswith(e.name + ".")
        )
        kind = "no_module" if missing else "import_failed"
        raise LoadError(kind, e)
    fn = module
    for part in qualname.split("."):
        try:
            fn = getattr(fn, part)
        except AttributeError as e:
            raise LoadError("no_function", AttributeError("module %s has no attribute %s" % (module_name, qualname)))
    if not callable(fn):
        raise LoadError("no_function", TypeError("%s:%s is a %s, not callable" % (module_name, qualname, type(fn).__qualname__)))
    source_hash = None
    try:
        import inspect

        source_hash = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except BaseException:
        try:
            with open(module.__file__, "rb") as f:
                source_hash = hashlib.sha256(f.read()).hexdigest()
        except BaseException:
            pass
    return fn, source_hash


def _become_subreaper():
    """Orphans of our calls (what a call started and left running, or what
    was running under it when it was killed) become our children, so the
    sweep after each call can end them. Best effort: False if refused."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except BaseException:
        return False


def _our_children():
    """The pids whose parent is this (single-threaded) process."""
    me = os.getpid()
    try:
        with open("/proc/self/task/%d/children" % me) as f:
            return [int(pid) for pid in f.read().split()]
    except OSError:
        pass
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2 :].split()[1]) == me:
            found.append(int(name))
    return found


def _sweep(keep):
    """Kills and reaps every child of ours that is not a call in `keep`: a
    call's leftovers, reparented to us. Each one killed orphans its own
    children to us, hence the rounds. A child we may not signal (a kernel
    whose sandbox lets us signal only ourselves) is left for the zygote's
    end, never waited for."""
    refused = set()
    for _ in range(1000):
        others = [pid for pid in _our_children() if pid not in keep and pid not in refused]
        if not others:
            return
        killed = []
        for pid in others:
            try:
                os.kill(pid, 9)
                killed.append(pid)
            except ProcessLookupError:
                killed.append(pid)
            except OSError:
                refused.add(pid)
        for pid in killed:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


class LoadError(Exception):
    def __init__(self, kind, exc):
        super().__init__(kind)
        self.kind = kind
        self.exc = exc


def _recv_exact(conn, n):
    """n bytes, or None at the end of the stream."""
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(min(n - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


class _TooLarge(Exception):
    pass


class _CappedWriter:
    """A file that refuses to grow past `cap` bytes: pickle.dump stops at
    the cap (--value-cap) instead of writing a huge value out first."""

    def __init__(self, f, cap):
        self.f = f
        self.cap = cap
        self.written = 0

    def write(self, data):
        self.written += memoryview(data).nbytes
        if self.written > self.cap:
            raise _TooLarge()
        return self.f.write(data)


def _call(spec, fn, message):
    """One item: the answer to send."""
    try:
        if "item_file" in message:
            import pickle

            with open(message["item_file"], "rb") as f:
                item = pickle.load(f)
        elif "item_json" in message:
            item = json.loads(message["item_json"])
        else:
            item = message["item"]
    except BaseException as e:
        return {"status": "error", "error": _error("bad_item", e)}
    try:
        value = fn(item)
    except BaseException as e:
        return {"status": "error", "error": _error("exception", e, skip_frames=1)}
    result = {"status": "ok", "value_type": type(value).__qualname__}
    try:
        text = json.dumps(value, allow_nan=False)
    except BaseException:
        text = None
    if text is None:
        result["value_omitted"] = "not JSON"
    elif len(text) > VALUE_JSON_MAX:
        result["value_omitted"] = "over 1 MiB"
    else:
        result["value"] = value
    values_dir = spec.get("values_dir")
    if values_dir:
        import pickle

        path = os.path.join(values_dir, "%d.pkl" % message["index"])
        try:
            with open(path + ".part", "wb") as f:
                pickle.dump(value, _CappedWriter(f, spec.get("value_cap", 1 << 62)), protocol=5)
            os.rename(path + ".part", path)
            result["value_file"] = path
        except BaseException as e:
            try:
                os.unlink(path + ".part")
            except OSError:
                pass
            if isinstance(e, _TooLarge):
                cap = spec.get("value_cap_text")
                message = "value_too_large: the pickled value passed %s; its writing stopped there (limit: --value-cap %s)"
                error = {"kind": "value_too_large", "message": message % (cap, cap)}
                return {"status": "error", "value_type": result["value_type"], "error": error}
            return {"status": "error", "value_type": result["value_type"], "error": _error("value_not_saved", e)}
    return result


def _child(spec, fn, fd, request):
    """A fresh process for one item, or --items-per-worker items in turn:
    each a length-prefixed JSON request, each answered the same way, until
    the supervisor closes its end. Never returns."""

    code = 0
    try:
        try:
            import ctypes

            libc = ctypes.CDLL(None)
            libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: gone with the zygote
            libc.prctl(36, 0, 0, 0, 0)  # not a subreaper: orphans go on up to the zygote
        except BaseException:
            pass
        for name, value in spec["original_env"].items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, value in (request.get("env") or {}).items():
            os.environ[name] = value
        conn = socket.socket(fileno=fd)
        while True:
            header = _recv_exact(conn, 8)
            if header is None:
                break
            body = _recv_exact(conn, struct.unpack("<Q", header)[0])
            if body is None:
                break
            result = _call(spec, fn, json.loads(body))
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:
                pass
            data = json.dumps(result).encode()
            conn.sendall(struct.pack("<Q", len(data)) + data)
    except BaseException:
        code = 70
        try:
            import traceback

            traceback.print_exc()
        except BaseException:
            pass
    os._exit(code)


def main():
    control = socket.socket(fileno=int(os.environ.pop("ISORUN_MAP_FD")))
    spec = json.loads(os.environ.pop("ISORUN_MAP_SPEC"))
    # Our stdout is the supervisor's stderr: its stdout holds the records.
    hello = {"pid": os.getpid(), "python": sys.version.split()[0], "executable": sys.executable}
    try:
        fn, source_hash = _load(spec)
    except LoadError as e:
        hello["error"] = _error(e.kind, e.exc)
        _send(control, {"hello": hello})
        return
    hello["source_sha256"] = source_hash
    hello["qualname"] = getattr(fn, "__qualname__", spec["function"])
    hello["threads"] = _threads()
    hello["cuda"] = _cuda()
    hello["sandbox_missing"] = os.environ.get("ISORUN_SANDBOX_MISSING") or None
    _send(control, {"hello": hello})

    if not spec.get("direct"):
        _become_subreaper()
    children = {}  # our pidfd -> pid, each reaped when it becomes readable
    while True:
        try:
            ready, _, _ = select.select([control.fileno()] + list(children), [], [])
        except InterruptedError:
            continue
        for fd in ready:
            if fd in children:
                pid = children.pop(fd)
                os.close(fd)
                _, status, usage = os.wait4(pid, 0)
                # What the call left running dies with it (already ours:
                # the kernel reparents orphans before the pidfd is readable).
                _sweep(set(children.values()))
                _send(control, {"exited": status, "pid": pid, "maxrss_kb": usage.ru_maxrss})
                continue
            try:
                data, fds, _, _ = socket.recv_fds(control, MAX_CONTROL, 4)
            except OSError:
                return
            if not data:
                return
            request = json.loads(data)
            if spec.get("direct"):
                # A fresh interpreter per call (the zygote could not fork safely).
                control.close()
                _child(spec, fn, fds[0], request)
            threads, cuda = _threads(), _cuda()
            if threads > 1 or cuda:
                for fd in fds:
                    os.close(fd)
                why = "it maps %s" % cuda if cuda else "it runs %d threads" % threads
                _send(control, {"fallback": why})
                continue
            pid = os.fork()
            if pid == 0:
                control.close()
                for other in children:
                    os.close(other)
                _child(spec, fn, fds[0], request)
            for fd in fds:
                os.close(fd)
            pidfd = os.pidfd_open(pid)
            # The pidfd goes to the supervisor before this process ever
            # reaps the child: the pid cannot be reused while it may kill.
            _send(control, {"forked": pid}, [pidfd])
            children[pidfd] = pid

main()
