"""Run one model's check per child process, with a memory cap and a timeout, and sweep many of them resumably.

`run_isolated(model_type, check)` forks a child from a forkserver that has torch and transformers imported already
(a spawned child would re-import them, ~3 s, for every model), caps its address space with RLIMIT_AS, and turns
whatever happens into a `Record`: the check's own verdict, or `crash` (the child died or raised), `oom` (a
MemoryError or an allocation failure in the child, or a SIGKILL from the kernel) or `timeout` (the child is killed).

`sweep(model_types, path, check)` runs at most `jobs` children at a time, appends each record as a JSON line to
`path` as soon as it is known, skips model types already recorded there (so an interrupted sweep resumes), and
reports `[i/N] model_type status` on stderr.

Five checks: `check_eager` (build the tiny model and run one forward; `tools/sweep_eager.py` sweeps it),
`check_export` (`verify_model` of one subject; `exportsmith verify --all` and `tools/coverage.py` sweep it),
`check_onnx` (`verify_onnx` of the generated copy; `tools/coverage.py` sweeps it), `check_executorch`
(`verify_executorch` of the generated copy; `exportsmith verify --executorch` runs it) and `check_real` (the generated
copy at a real checkpoint configuration; `tools/real_configs.py` sweeps it).
"""

import json
import multiprocessing
import multiprocessing.connection
import re
import resource
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from exportsmith.verify.check import DIM_STYLES, FAILURE_KINDS, verify_model
from exportsmith.verify.errors import first_line
from exportsmith.verify.executorch_check import FAILURE_KINDS as EXECUTORCH_FAILURE_KINDS
from exportsmith.verify.executorch_check import verify_executorch
from exportsmith.verify.onnx_check import FAILURE_KINDS as ONNX_FAILURE_KINDS
from exportsmith.verify.onnx_check import verify_onnx
from exportsmith.verify.real import real_config
from exportsmith.verify.tasks import (
    AUDIO_LAYOUTS,
    config_for,
    containing_model_type,
    dummy_inputs,
    has_forward,
    model_class,
    takes_audio,
)
from exportsmith.verify.tiny import TooLarge, build_tiny_model, parameter_count, tiny_config

EAGER_STATUSES = ("ok", "refused", "build-error", "eager-error")
ISOLATION_FAILURES = ("crash", "oom", "timeout")
STATUSES = tuple(
    dict.fromkeys(EAGER_STATUSES + FAILURE_KINDS + ONNX_FAILURE_KINDS + EXECUTORCH_FAILURE_KINDS + ISOLATION_FAILURES)
)
MEMORY_LIMIT = 6 * 2**30  # bytes of address space per child
TIMEOUT = 300.0  # seconds per child
JOBS = 2  # children at a time: one per core

# A check runs in the child: model_type -> {"status", "reason", "params", ...}. It must be a module-level function
# (it is pickled by reference).
Check = Callable[[str], dict]


@dataclass
class Record:
    model_type: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    params: int | None = None
    model_class: str | None = None
    details: dict = field(default_factory=dict)  # the check's own findings (export: location, cases)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r} for {self.model_type}")


def is_out_of_memory(error: BaseException) -> bool:
    # torch's CPU allocator raises RuntimeError("... DefaultCPUAllocator: can't allocate memory ..."): the message
    # is the only thing that tells it from other RuntimeErrors.
    return isinstance(error, MemoryError) or "can't allocate memory" in str(error)


# transformers' message when a model needs an optional package that is not installed (timm, natten, detectron2...)
MISSING_PACKAGE = re.compile(r"requires the (\w+) library but it was not found")


def holds_config(config, config_class: type) -> bool:
    """Whether `config` or one of its sub-configs (recursively) is a `config_class`, set rather than left None."""
    if isinstance(config, config_class):
        return True
    subs = (getattr(config, name, None) for name in getattr(config, "sub_configs", {}))
    return any(holds_config(sub, config_class) for sub in subs if sub is not None)


def check_eager(model_type: str) -> dict:
    """Build the tiny model of `model_type` (refused above the budget, or when it needs a missing optional package)
    and run one eager forward on dummy inputs. A part of a model without a class of its own (a mask decoder), or
    with a class in no auto mapping whose main input (another part's output) cannot be built, is built and run
    inside its container (`containing_model_type`), whose class the record names."""
    try:
        task, _ = model_class(model_type)
    except LookupError as error:
        container = containing_model_type(model_type)
        if container is None:
            return {"params": None, "model_class": None, "status": "build-error", "reason": first_line(error)}
        return check_in_container(model_type, container)
    record = check_alone(model_type)
    if task == "config-class" and record["status"] == "eager-error" and UNBUILDABLE_INPUT in record["reason"]:
        # a part with a class of its own but no auto mapping (a DETR encoder taking another part's features):
        # its container builds what it takes
        container = containing_model_type(model_type)
        if container is not None:
            return check_in_container(model_type, container)
    return record


UNBUILDABLE_INPUT = "cannot build the main input"


def check_in_container(model_type: str, container: str) -> dict:
    record = check_eager(container)
    if record["status"] == "ok" and not holds_config(tiny_config(container), CONFIG_MAPPING[model_type]):
        reason = f"part of {container}, whose default config leaves it out: it is never built"
        return {"params": None, "model_class": None, "status": "build-error", "reason": reason}
    reason = f"built as part of {container}" + (f": {record['reason']}" if record["reason"] else "")
    return {**record, "reason": reason}


def check_alone(model_type: str) -> dict:
    stage = "build-error"
    record = {"params": None, "model_class": None}
    try:
        _, cls = model_class(model_type)
        record["model_class"] = cls.__name__
        model = build_tiny_model(cls, config_for(cls, tiny_config(model_type)))
        record["params"] = parameter_count(model)
        if not has_forward(model):
            reason = (
                f"{cls.__name__} defines no forward: it is used only through other methods (generate, encode, decode)"
            )
            return {**record, "status": "refused", "reason": reason}
        stage = "eager-error"
        run_eager(model)
    except TooLarge as error:
        return {**record, "status": "refused", "reason": str(error)}
    except Exception as error:
        # every package the error names (PIL and timm, say), in order: which one comes first depends on the machine
        missing = list(dict.fromkeys(MISSING_PACKAGE.findall(str(error)))) if isinstance(error, ImportError) else []
        if missing:
            packages = "package " + missing[0] if len(missing) == 1 else "packages " + ", ".join(missing)
            return {**record, "status": "refused", "reason": f"needs the optional {packages}"}
        return {**record, "status": "oom" if is_out_of_memory(error) else stage, "reason": first_line(error)}
    return {**record, "status": "ok", "reason": ""}


def _path_first(path: str | None) -> None:
    """Put `path` (where the package under test lives) first on sys.path, once."""
    if path is not None and path not in sys.path:
        sys.path.insert(0, path)


def check_export(model_type: str, subject: str, package: str, path: str | None = None) -> dict:
    """`verify_model` of one subject, as a record; `path` goes first on sys.path (where `package` lives)."""
    _path_first(path)
    result = verify_model(model_type, package, subject)
    return {
        "status": "ok" if result.ok else result.failure,
        "reason": result.message,
        "model_class": result.model_class,
        "details": {
            key: value
            for key, value in result.record().items()
            if key in ("location", "guard", "eager_identical", "cases", "greedy", "outside_range")
        },
    }


def check_real(name: str, package: str, path: str | None = None) -> dict:
    """`verify_model` of the generated copy at the real configuration `name` (`real.py`), its programs exported with
    the primary dims style only (a real model's cases cost seconds each), as a record with the peak memory of the
    process."""
    _path_first(path)
    config = real_config(name)
    result = verify_model(config.model_type, package, "generated", config=config, styles=DIM_STYLES[:1])
    return {
        "status": "ok" if result.ok else result.failure,
        "reason": result.message,
        "model_class": result.model_class,
        "details": {
            "model_type": config.model_type,
            "layers": config.num_hidden_layers,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: kilobytes
            **{key: value for key, value in result.record().items() if key in ("location", "cases", "greedy")},
        },
    }


def check_onnx(model_type: str, package: str, path: str | None = None) -> dict:
    """`verify_onnx` of the generated copy, as a record; `path` goes first on sys.path (where `package` lives)."""
    _path_first(path)
    result = verify_onnx(model_type, package)
    return {
        "status": "ok" if result.ok else result.failure,
        "reason": result.message,
        "details": {"max_diff": result.max_diff, "cases": len(result.cases)},
    }


def check_executorch(model_type: str, package: str, path: str | None = None) -> dict:
    """`verify_executorch` of the generated copy, as a record; `path` goes first on sys.path (where `package` lives).
    In a child: the ExecuTorch runtime aborts the process on some kernels' failed checks (t5)."""
    _path_first(path)
    result = verify_executorch(model_type, package)
    return {
        "status": "ok" if result.ok else result.failure,
        "reason": result.message if not result.ok else result.summary,
        "details": {"max_diff": result.max_diff, "cases": len(result.cases)},
    }


def run_eager(model: torch.nn.Module) -> None:
    """One forward on dummy inputs; for audio, each layout in turn until one runs (the first one's error if none)."""
    layouts = range(AUDIO_LAYOUTS) if takes_audio(model) else range(1)
    first_error = None
    for layout in layouts:
        try:
            inputs = dummy_inputs(model, audio_layout=layout)
            with torch.no_grad():
                model(**inputs)
            return
        except Exception as error:
            if is_out_of_memory(error):
                raise
            first_error = first_error or error
    raise first_error


def child_main(check: Check, model_type: str, memory_limit: int, connection) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    torch.set_num_threads(1)  # JOBS children share the cores
    try:
        result = check(model_type)
    except BaseException as error:  # the check itself failed: the sweep records it and goes on
        result = {"status": "oom" if is_out_of_memory(error) else "crash", "reason": first_line(error)}
    connection.send(result)
    connection.close()


def context():
    ctx = multiprocessing.get_context("forkserver")
    # Children fork from a server that has imported this module, hence torch and transformers.
    ctx.set_forkserver_preload(["exportsmith.verify.isolate"])
    return ctx


@dataclass
class Running:
    model_type: str
    process: multiprocessing.Process
    connection: multiprocessing.connection.Connection
    started: float


def start(check: Check, model_type: str, memory_limit: int) -> Running:
    receiver, sender = context().Pipe(duplex=False)
    process = context().Process(target=child_main, args=(check, model_type, memory_limit, sender), daemon=True)
    process.start()
    sender.close()
    return Running(model_type, process, receiver, time.monotonic())


def finish(running: Running, timeout: float | None) -> Record:
    """The record of a child that exited, or that is killed now because it ran past `timeout` (when given)."""
    seconds = round(time.monotonic() - running.started, 1)
    if timeout is not None:
        running.process.kill()
        running.process.join()
        return Record(running.model_type, "timeout", f"no result within {timeout:g} s", seconds)
    result = None
    if running.connection.poll():
        try:
            result = running.connection.recv()
        except EOFError:
            result = None
    running.process.join()
    running.connection.close()
    if result is None:
        code = running.process.exitcode
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            status = "oom" if -code == signal.SIGKILL else "crash"
            return Record(running.model_type, status, f"child killed by {name}", seconds)
        return Record(running.model_type, "crash", f"child exited with code {code} and no result", seconds)
    return Record(
        running.model_type,
        seconds=seconds,
        **{key: result[key] for key in ("status", "reason", "params", "model_class", "details") if key in result},
    )


def run_isolated(
    model_type: str, check: Check = check_eager, timeout: float = TIMEOUT, memory_limit: int = MEMORY_LIMIT
) -> Record:
    """One check of one model type in its own child process."""
    running = start(check, model_type, memory_limit)
    running.process.join(timeout)
    return finish(running, timeout if running.process.is_alive() else None)


def recorded(path: Path) -> dict[str, dict]:
    """model_type -> record of the JSON lines already in `path` (a torn line is ignored, its type checked again)."""
    records = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            records[record["model_type"]] = record
    return records


def sweep(
    model_types: Iterable[str],
    path: Path,
    check: Check = check_eager,
    jobs: int = JOBS,
    timeout: float = TIMEOUT,
    memory_limit: int = MEMORY_LIMIT,
) -> dict[str, dict]:
    """Check every model type not yet recorded in `path`, `jobs` at a time; -> all records of `path`."""
    model_types = list(model_types)
    done = recorded(path)
    pending = [model_type for model_type in model_types if model_type not in done]
    total, count = len(model_types), len(model_types) - len(pending)
    running: list[Running] = []
    with path.open("a") as out:
        if path.stat().st_size and not path.read_text().endswith("\n"):
            out.write("\n")  # after a torn last line (an interrupted write), start a new one
        while pending or running:
            while pending and len(running) < jobs:
                running.append(start(check, pending.pop(0), memory_limit))
            now = time.monotonic()
            deadline = min(item.started + timeout for item in running)
            multiprocessing.connection.wait([item.process.sentinel for item in running], max(0.0, deadline - now))
            for item in list(running):
                timed_out = time.monotonic() >= item.started + timeout
                if item.process.is_alive() and not timed_out:
                    continue
                running.remove(item)
                record = finish(item, timeout if timed_out and item.process.is_alive() else None)
                out.write(json.dumps(asdict(record)) + "\n")
                out.flush()
                count += 1
                print(f"[{count}/{total}] {record.model_type} {record.status}", file=sys.stderr, flush=True)
    return recorded(path)
