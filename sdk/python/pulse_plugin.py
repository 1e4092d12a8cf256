"""pulse_plugin: write a pulse-host job handler in Python (componentize-py).

The same helpers as the Rust SDK (`sdk/rust`), over the bindings
componentize-py generates from `wit/job.wit` (world `job-handler`). A host
refusal becomes a job error the call raises, so a handler reads straight:

    from wit_world import exports
    import pulse_plugin as pulse

    class Handler(exports.Handler):
        def start(self, job: pulse.Job) -> None:
            pulse.info(f"start {job.key}")
            pulse.emit(job.key, job.payload)

        def stop(self, key: str) -> None: ...
        def notify(self, key: str, payload: bytes) -> None: pulse.emit(key, payload)
        def on_timer(self, key: str, name: str) -> None: ...

Keep this file beside `app.py` (componentize-py finds it there), or pass
its folder with `-p`.

What a call writes (`emit`, `save_state`, `complete`) is written when the
call returns, in one step with its answer, or not at all.
"""

from typing import Callable, Optional, TypeVar

from componentize_py_types import Err
from wit_world.imports import env, host, types

Job = types.Job
JobFence = types.JobFence

T = TypeVar("T")


def invalid_input(message: str) -> Err:
    """A job error that refuses the job: `raise pulse.invalid_input("…")`."""
    return Err(types.JobError_InvalidInput(message))


def retryable(message: str) -> Err:
    """A job error after which the start is tried again later."""
    return Err(types.JobError_Retryable(message))


def fatal(message: str) -> Err:
    """A job error that fails the job."""
    return Err(types.JobError_Fatal(message))


def _request(what: str, call: Callable[[], T]) -> T:
    """Makes a host request; a refusal ends the call: the job moved away
    or a limit was passed (fatal), or Redis cannot be reached (retryable)."""
    try:
        return call()
    except Err as refused:
        error = refused.value
        if isinstance(error, types.HostError_Unavailable):
            raise retryable(f"{what}: unavailable: {error.value}")
        if isinstance(error, types.HostError_LimitExceeded):
            raise fatal(f"{what}: limit exceeded: {error.value}")
        raise fatal(f"{what}: the job is no longer owned here")


def emit(key: str, payload: bytes) -> None:
    """Publishes an event of job `key` on the pool's events stream."""
    _request("emit", lambda: host.emit(key, payload))


def save_state(key: str, state: bytes) -> None:
    """Stores job `key`'s state: its next start, here or elsewhere, gets it."""
    _request("save-state", lambda: host.save_state(key, state))


def complete(key: str) -> None:
    """Job `key` finished by itself: the host removes it."""
    _request("complete", lambda: host.complete(key))


def set_timer(key: str, name: str, delay_ms: int, repeat: bool = False) -> None:
    """Arms timer `name` of job `key` (again every `delay_ms` when
    `repeat`); timers live with the instance: re-arm them in `start`."""
    _request("set-timer", lambda: host.set_timer(key, name, delay_ms, repeat))


def cancel_timer(key: str, name: str) -> bool:
    """Disarms timer `name` of job `key`; whether one was armed."""
    return host.cancel_timer(key, name)


def setting(name: str) -> Optional[str]:
    """The plugin's setting `name` (config.toml's `settings`), if set."""
    return env.config(name)


def setting_int(name: str, default: int) -> int:
    """Setting `name` as a whole number, `default` when unset; a value that
    is not one fails the job, naming the setting."""
    text = env.config(name)
    if text is None:
        return default
    if not text.strip().isdigit():
        raise fatal(f"setting {name} = {text!r} is not a whole number")
    return int(text)


def parse_number(data: Optional[bytes]) -> Optional[int]:
    """A whole number written as decimal text (a payload, a saved count)."""
    if data is None:
        return None
    text = data.decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


def fence() -> Optional[JobFence]:
    """The pool, key and fencing token of the job whose call runs."""
    return env.fence()


def debug(message: str) -> None:
    env.log(types.LogLevel.DEBUG, message)


def info(message: str) -> None:
    env.log(types.LogLevel.INFO, message)


def warn(message: str) -> None:
    env.log(types.LogLevel.WARN, message)


def error(message: str) -> None:
    env.log(types.LogLevel.ERROR, message)
