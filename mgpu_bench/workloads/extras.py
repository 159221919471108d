"""The optional extra `[models]` (torchvision, transformers), imported only when a workload names
it: missing, or installed but not loading beside this torch, it is one line (InputError, exit 2)
naming the release to install, never a traceback.

torchvision is compiled against one torch release: torchvision 0.N goes with torch 2.(N-15) for
torch 2.x (torch 2.13 with torchvision 0.28, 2.14 with 0.29: PyTorch's compatibility table,
https://github.com/pytorch/vision#installation). Another pairing fails at import, typically with
"operator torchvision::nms does not exist" (a RuntimeError from its compiled operators), and so
does a CUDA build of torchvision beside a CPU build of torch. A bare `pip install torchvision` (or
`pip install 'mgpu-bench[models]'`) takes the newest torchvision, which replaces a CPU torch with
the CUDA build it was made for: the advice names the release of the torch installed here instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from importlib.metadata import PackageNotFoundError, version

from mgpu_bench.core.errors import InputError

CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # where the CPU builds of torch and torchvision are
# A pair known to load together (the one CI installs), for a torch whose release has no rule here.
KNOWN_PAIR = "torch==2.14.1 torchvision==0.29.1"
TRANSFORMERS_MIN = "4.46"  # pyproject.toml's [models] bound


def installed(dist: str) -> str | None:
    """The installed version of the distribution `dist` ("2.13.0+cpu"), read from its metadata
    without importing it; None where it is not installed."""
    try:
        return version(dist)
    except PackageNotFoundError:
        return None
    except (OSError, ValueError):  # unreadable metadata: as good as not known
        return None


def _minor(text: str | None, major: int) -> int | None:
    m = re.match(rf"{major}\.(\d+)", text or "")
    return int(m.group(1)) if m else None


def vision_release(torch_version: str | None) -> str | None:
    """"0.28" for torch 2.13.x: the torchvision release built for it; None beyond the rule."""
    minor = _minor(torch_version, 2)
    return f"0.{minor + 15}" if minor is not None else None


def torch_release(vision_version: str | None) -> str | None:
    """"2.14" for torchvision 0.29.x: the torch release it was built for; None beyond the rule."""
    minor = _minor(vision_version, 0)
    return f"2.{minor - 15}" if minor is not None and minor >= 15 else None


def vision_install(torch_version: str | None) -> str:
    """The pip line that installs the torchvision of this torch (its CPU build beside a CPU torch)."""
    release = vision_release(torch_version)
    if release is None:
        return f"pip install {KNOWN_PAIR}"
    index = f" --index-url {CPU_INDEX}" if "+cpu" in (torch_version or "") else ""
    return f"pip install 'torchvision=={release}.*'{index}"


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(exc).__name__


def _missing(module: str, exc: BaseException) -> bool:
    """Whether `exc`, raised importing `module`, says the module itself is not installed (rather
    than that it is installed and failed to load)."""
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == module:
        return True
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def vision_mismatch(exc: BaseException) -> InputError:
    """The line for a torchvision that is installed but does not load beside this torch."""
    tv, torch = installed("torchvision"), installed("torch")
    want, built_for = vision_release(torch), torch_release(tv)
    cpu_torch = "+cpu" in (torch or "")
    if want and tv and _minor(tv, 0) == _minor(want, 0):  # the right release, the other build
        why = f"a {'CUDA' if cpu_torch else 'CPU'} build beside a {'CPU' if cpu_torch else 'CUDA'} build of torch"
    else:
        why = f"it was built for torch {built_for}" if built_for else "built for another torch"
    mine = _minor(torch, 2)
    other = f"or torch {built_for} for this torchvision; " if built_for and mine is not None and \
        built_for != f"2.{mine}" else ""
    return InputError(f"torchvision {tv or '(unknown version)'} does not match torch {torch or '(unknown version)'} "
                      f"({why}: {_first_line(exc)}): install the torchvision of this torch: {vision_install(torch)} "
                      f"({other}the pairs: github.com/pytorch/vision#installation)")


def torchvision():
    """The torchvision module, or InputError: missing (the install line for this torch) or not
    loading beside this torch (the matching pair)."""
    try:
        return importlib.import_module("torchvision")
    except Exception as exc:  # noqa: BLE001 - whatever a broken install raises (RuntimeError, OSError, ImportError)
        if _missing("torchvision", exc):
            torch = installed("torch")
            raise InputError(f"torchvision workloads need torchvision ({_first_line(exc)}): {vision_install(torch)}"
                             + (f" (torchvision {vision_release(torch)} is the release of torch {torch})"
                                if vision_release(torch) else "")) from None
        raise vision_mismatch(exc) from None


def transformers_mismatch(exc: BaseException | None) -> InputError:
    """The line for a transformers that is installed but does not work beside this torch."""
    tf, torch = installed("transformers"), installed("torch")
    why = _first_line(exc) if exc is not None else "it finds no usable torch"
    return InputError(f"transformers {tf or '(unknown version)'} does not work with torch {torch or '(unknown version)'} "
                      f"({why}): install a transformers release made for this torch: pip install -U "
                      f"'transformers>={TRANSFORMERS_MIN}' (or a torch this transformers supports)")


def transformers():
    """The transformers module with its torch models usable, or InputError: missing (the install
    line) or not working beside this torch (transformers turns its torch models off, or they fail
    to import)."""
    try:
        tf = importlib.import_module("transformers")
    except Exception as exc:  # noqa: BLE001 - whatever a broken install raises
        if _missing("transformers", exc):
            raise InputError(f"hf: workloads need transformers ({_first_line(exc)}): pip install "
                             f"'transformers>={TRANSFORMERS_MIN}'") from None
        raise transformers_mismatch(exc) from None
    try:
        usable = bool(tf.utils.is_torch_available())
    except Exception as exc:  # noqa: BLE001 - a transformers too old or too new to ask
        raise transformers_mismatch(exc) from None
    if not usable:
        raise transformers_mismatch(None)
    return tf


def auto_class(tf, name: str):
    """transformers.`name` (AutoModelForCausalLM, ...): a lazy import of its torch models, where a
    transformers that does not fit this torch fails; InputError then."""
    try:
        return getattr(tf, name)
    except Exception as exc:  # noqa: BLE001 - transformers wraps the failure in RuntimeError or ImportError
        raise transformers_mismatch(exc) from None
