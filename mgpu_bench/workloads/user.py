"""`module:function` and `path/file.py:function`: the user's own training step.

The function is called with a torch.device (first torch.device("meta"), where mgpu-bench counts
FLOPs without memory, then each rank's GPU or CPU) and returns either a tuple

    (model, make_batch or dataloader, loss)  or  (model, make_batch or dataloader, loss, tokens_per_sample)

or a dict with the keys

    model              the nn.Module, on the device given (model.to(device) works for meta too)
    batch              make_batch(n) -> one batch of n samples on the device (any nesting of tensors)
    loader             a DataLoader, or loader(n) -> one of batch size n; batches are moved to the device
    loss               loss(model, batch) -> the 0-d loss tensor; use the model given (it may be wrapped
                       in DDP, FSDP or torch.compile)
    tokens_per_sample  optional: tokens per sample, for tokens/s
    blocks             optional: the repeated blocks (FSDP units, activation checkpointing); found otherwise
    optimizer          optional: optimizer(model) -> a torch optimizer [default: AdamW, lr 1e-4]
    autocast           optional: False to run without bf16 autocast on GPUs

batch or loader, at least one. With only a loader, synthetic (effective) steps reuse its first
batch on the device; `--data loader` steps draw a new batch each step, a new epoch when it ends.

The module's code runs under a bound: its import and every call of its functions (the workload
function, batch, loader, loss, optimizer) must return within USER_CODE_S seconds (the environment
variable MGPU_BENCH_USER_CODE_TIMEOUT sets another bound, in seconds), and must not end the
process (sys.exit). One that does is said in one line: before measuring, as bad input (exit code
2, nothing written); in a rank's step, as that configuration's failure (UserCodeError; the
configurations measured before it are kept).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import signal
import sys
import threading
from pathlib import Path

from mgpu_bench.core.errors import InputError, MgpuError

from .base import Workload, adamw, as_device, last_line

# How long the module's import and each call of its functions may take: importing torch and
# transformers and building a large model take well under a minute, a torch.compile of a large
# model's first step a few minutes; a call that has not returned after 10 minutes waits on
# something that never comes (a sleep, a lock, input(), a peer).
USER_CODE_S = 600.0
USER_CODE_ENV = "MGPU_BENCH_USER_CODE_TIMEOUT"


class UserCodeError(MgpuError):
    """The user's module overran its bound (USER_CODE_S) or called sys.exit."""


class _Overran(BaseException):  # a BaseException: the user's own `except Exception` does not swallow it
    pass


class _Exited(BaseException):
    """os._exit(code) called by the user's code inside bounded(): raised instead of ending the process."""

    def __init__(self, code) -> None:
        super().__init__(code)
        self.code = code


# (pid, thread id) -> how many bounded() blocks run there now: os._exit is guarded in those alone (a
# forked child, a DataLoader worker, another thread of the job's, still ends as it asks)
_guarded: dict[tuple[int, int], int] = {}
_real_exit = os._exit


def _exit_guard(code) -> None:
    """os._exit while a bounded() block runs: in the block's own thread and process, the user's code
    ending the process silently (exit code 0, nothing measured) becomes the block's error."""
    if _guarded.get((os.getpid(), threading.get_ident())):
        raise _Exited(code)
    _real_exit(code)


@contextlib.contextmanager
def _exit_guarded():
    key = (os.getpid(), threading.get_ident())
    _guarded[key] = _guarded.get(key, 0) + 1
    os._exit = _exit_guard
    try:
        yield
    finally:
        left = _guarded.pop(key, 1) - 1
        if left:
            _guarded[key] = left
        if not any(pid == key[0] for pid, _ in _guarded):
            os._exit = _real_exit


def _a_stop_signal_came() -> bool:
    """Whether a KeyboardInterrupt may be a real Ctrl-C (or SIGTERM, SIGHUP): one was received, or
    no handler of the CLI's (errors.handle_stop_signals) records them in this process, so that it
    cannot be told (a rank's process, a library caller): only where one is recorded and none came
    is a KeyboardInterrupt the user's code's own."""
    from mgpu_bench.core import errors

    recording = signal.getsignal(signal.SIGINT) is getattr(errors, "_stop_signal", None)
    return not recording or errors.interrupted() or errors.terminated()


def user_code_limit() -> float:
    """USER_CODE_S, or the seconds MGPU_BENCH_USER_CODE_TIMEOUT gives (InputError when it is not a
    positive number)."""
    from mgpu_bench.results.numbers import ascii_float

    text = os.environ.get(USER_CODE_ENV)
    if text is None:
        return USER_CODE_S
    value = ascii_float(text)
    if value is None or not 0 < value < 1e7:
        raise InputError(f"{USER_CODE_ENV}={text!r}: give the seconds a workload module's code may take, e.g. 600")
    return value


@contextlib.contextmanager
def bounded(what: str):
    """Runs the block (the user's code) under user_code_limit(): a SIGALRM timer raises in the
    main thread when the block overruns it, which becomes UserCodeError naming `what`; sys.exit,
    os._exit (which would end the tool silently, exit code 0 and nothing measured) and a
    KeyboardInterrupt no stop signal caused in the block become UserCodeError too. Off the main
    thread, or where a timer or another SIGALRM handler is already set (a caller's own), the block
    runs without the time bound, as it is. (A process killed outright from the block, by
    os.kill(SIGKILL) or C's exit(), is beyond what Python sees.)"""
    limit = user_code_limit()
    free = (threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
            and signal.getitimer(signal.ITIMER_REAL)[0] == 0
            and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None))
    if free:
        def overran(signum, frame):
            raise _Overran()

        signal.signal(signal.SIGALRM, overran)
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        with _exit_guarded():
            yield
    except _Overran:
        raise UserCodeError(f"{what} did not return within {limit:g} s: it waits on something that never comes (a "
                            f"sleep, a lock, input(), a peer); fix it, or set {USER_CODE_ENV} to the seconds it "
                            "needs") from None
    except SystemExit as exc:
        raise UserCodeError(f"{what} called sys.exit({exc.code!r}): a workload's code must return (or raise an "
                            "exception that says what is wrong), not end the process") from None
    except _Exited as exc:
        raise UserCodeError(f"{what} called os._exit({exc.code!r}): a workload's code must return (or raise an "
                            "exception that says what is wrong), not end the process") from None
    except KeyboardInterrupt:
        if _a_stop_signal_came():
            raise
        raise UserCodeError(f"{what} raised KeyboardInterrupt with no Ctrl-C pressed: the module's error, not a stop "
                            "(a workload's code must return, or raise an exception that says what is wrong)") from None
    finally:
        if free:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

KEYS = ("model", "batch", "loader", "loss", "tokens_per_sample", "blocks", "optimizer", "autocast")
EXPECTED = ("(model, make_batch or DataLoader, loss[, tokens_per_sample]) or a dict with model, batch or loader, "
            "loss and optionally tokens_per_sample, blocks, optimizer, autocast")


def _import(target: str):
    """The module `target` names: a file (path/file.py, its folder put first on sys.path so that
    its own imports resolve) or a dotted module name (importable from the current folder too)."""
    if target.endswith(".py") or os.sep in target:
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise InputError(f"module file {target} does not exist")
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = f"mgpu_bench_user_{path.stem}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            with bounded(f"importing the module file {target}"):
                spec.loader.exec_module(module)
        except UserCodeError as exc:
            del sys.modules[name]
            raise InputError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the user's module: any failure is bad input
            del sys.modules[name]
            raise InputError(f"module file {target} does not import: {last_line(exc)}") from None
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        with bounded(f"importing the module {target}"):
            return importlib.import_module(target)
    except UserCodeError as exc:
        raise InputError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"module {target} does not import: {last_line(exc)}") from None


class UserWorkload(Workload):
    kind = "module"

    def __init__(self, text: str) -> None:
        body = text.removeprefix("module:")
        target, _, fn_name = body.rpartition(":")
        if not target or not fn_name.isidentifier():
            raise InputError(f"--model {text!r}: write module:function or path/file.py:function")
        module = _import(target)
        fn = getattr(module, fn_name, None)
        if not callable(fn):
            public = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
                            and v.__module__ == module.__name__)
            raise InputError(f"{target} has no function {fn_name}" + (f" (it has {', '.join(public[:8])})"
                                                                      if public else ""))
        self.where = f"{target}:{fn_name}"
        stem = Path(target).stem if target.endswith(".py") or os.sep in target else target
        super().__init__(text, f"module:{stem}:{fn_name}")
        self._fn = fn
        self._spec: dict[str, dict] = {}
        self._first: dict[str, object] = {}
        self._call("meta")  # validates the protocol here, before anything runs

    @property
    def tokens_per_sample(self) -> int | None:
        return self._spec["meta"]["tokens_per_sample"] if "meta" in self._spec else self._latest["tokens_per_sample"]

    # -- the protocol

    def _call(self, device) -> dict:
        """fn(device), checked against the protocol; kept as the latest spec for that device."""
        import torch

        dev = as_device(device)
        try:
            with bounded(f"{self.where}({dev})"):
                got = self._fn(dev)
        except InputError:
            raise
        except UserCodeError as exc:
            raise InputError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the user's function: any failure is bad input
            hint = (" (it is called with torch.device('meta') first, to count FLOPs without memory: build with "
                    "model.to(device))") if dev.type == "meta" else ""
            raise InputError(f"{self.where} raised on device {dev}: {last_line(exc)}{hint}") from None
        spec = self._check(got, torch)
        self._spec.pop(str(dev), None)  # re-inserted last: _latest is the spec of the latest call
        self._spec[str(dev)] = spec
        self._first.pop(str(dev), None)
        return spec

    def _check(self, got, torch) -> dict:
        def bad(what: str):
            return InputError(f"{self.where} returned {what}: expected {EXPECTED}")

        if isinstance(got, (tuple, list)):
            if len(got) not in (3, 4):
                raise bad(f"a {type(got).__name__} of {len(got)}")
            second = got[1]
            spec = {"model": got[0], "loss": got[2], "tokens_per_sample": got[3] if len(got) == 4 else None,
                    "batch" if callable(second) else "loader": second}
        elif isinstance(got, dict):
            unknown = [k for k in got if k not in KEYS]
            if unknown:
                raise bad(f"a dict with {', '.join(map(repr, unknown))}")
            spec = dict(got)
        else:
            raise bad(type(got).__name__)
        if not isinstance(spec.get("model"), torch.nn.Module):
            raise bad(f"a model of type {type(spec.get('model')).__name__} (not a torch.nn.Module)")
        if spec.get("batch") is None and spec.get("loader") is None:
            raise bad("neither a batch maker nor a DataLoader")
        if spec.get("batch") is not None and not callable(spec["batch"]):
            raise bad("a batch that is not a function of the batch size")
        loader = spec.get("loader")
        if loader is not None and not callable(loader) and not hasattr(loader, "__iter__"):
            raise bad(f"a loader of type {type(loader).__name__} (neither iterable nor a function)")
        if not callable(spec.get("loss")):
            raise bad("a loss that is not a function of (model, batch)")
        tps = spec.get("tokens_per_sample")
        if tps is not None and (isinstance(tps, bool) or not isinstance(tps, int) or tps < 1):
            raise bad(f"tokens_per_sample {tps!r} (a positive int or None)")
        blocks = spec.get("blocks")
        if blocks is not None:
            inside = {id(m) for m in spec["model"].modules()}
            if not isinstance(blocks, (list, tuple)) or not all(isinstance(b, torch.nn.Module) and id(b) in inside
                                                                for b in blocks):
                raise bad("blocks that are not a list of the model's own modules")
        if spec.get("optimizer") is not None and not callable(spec["optimizer"]):
            raise bad("an optimizer that is not a function of the model")
        return {k: spec.get(k) for k in KEYS}

    def count_flops(self, batch_size: int, device="meta"):
        try:
            return super().count_flops(batch_size, device)
        except InputError as exc:  # the protocol broken in the step itself: say whose step
            raise InputError(f"{self.where}: {exc}") from None
        except UserCodeError as exc:  # before measuring: bad input
            raise InputError(str(exc)) from None

    def _for(self, device) -> dict:
        dev = str(as_device(device))
        return self._spec.get(dev) or self._call(device)

    # -- the Workload

    @property
    def has_loader(self) -> bool:
        return self._latest["loader"] is not None

    def default_batch(self, on_gpu: bool) -> int:
        loader = self._spec["meta"]["loader"]
        fixed = getattr(loader, "batch_size", None) if loader is not None and not callable(loader) else None
        return fixed if isinstance(fixed, int) and fixed > 0 else (8 if on_gpu else 4)

    def autocast_dtype(self, device):
        return super().autocast_dtype(device) if self._for(device)["autocast"] is not False else None

    def _build(self, device, checkpointing: bool):
        return self._call(device)["model"], False

    def blocks(self, model) -> list:
        spec = next((s for s in self._spec.values() if s["model"] is model), None)
        if spec is not None and spec["blocks"] is not None:
            return list(spec["blocks"])
        return super().blocks(model)

    def _loader(self, spec: dict, batch_size: int):
        loader = spec["loader"]
        if callable(loader):
            with bounded(f"{self.where}'s loader({batch_size})"):
                return loader(batch_size)
        fixed = getattr(loader, "batch_size", None)
        if isinstance(fixed, int) and fixed != batch_size:
            raise InputError(f"its DataLoader makes batches of {fixed}: give --batch-size {fixed}, or return "
                             "loader(n) that builds one of batch size n")
        return loader

    def batch(self, batch_size: int, device, generator=None):
        spec = self._for(device)
        if spec["batch"] is not None:
            with bounded(f"{self.where}'s batch({batch_size})"):
                return spec["batch"](batch_size)
        key = str(as_device(device))
        if key not in self._first:  # only a DataLoader: its first batch, on the device, reused
            self._first[key] = self.prepare(next(iter(self._loader(spec, batch_size))), device)
        return self._first[key]

    def loader(self, batch_size: int, *, num_workers: int = 2, preprocess_ms: float = 0.0, data_dir: str | None = None,
               seed: int = 0, samples: int = 4096, pin_memory: bool = False):
        """The module's own DataLoader as it is (--num-workers and --preprocess-ms are the built-in
        pipelines' settings)."""
        spec = self._latest
        if spec["loader"] is None:
            raise InputError(f"{self.where} gives no DataLoader, only a batch maker: --data loader needs one "
                             "(return 'loader')")
        return self._loader(spec, batch_size)

    def loss(self, model, batch):
        with bounded(f"{self.where}'s loss"):
            return self._latest["loss"](model, batch)

    @property
    def _latest(self) -> dict:
        """The spec of the latest call: the one whose model is being trained."""
        return list(self._spec.values())[-1]

    def optimizer(self, model):
        spec = self._latest
        if spec["optimizer"] is None:
            return adamw(model, lr=1e-4, weight_decay=0.01)
        with bounded(f"{self.where}'s optimizer"):
            return spec["optimizer"](model)
