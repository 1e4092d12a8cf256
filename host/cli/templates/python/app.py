"""`{{name}}`: a pulse-host job handler in Python (componentize-py).

- `start` emits `hello <payload>`, resumes its count from the saved state
  (or 0) and arms a `tick` timer every `interval-ms` (setting; default
  1000).
- Each tick adds one to the count, saves it (a move or a crash resumes
  from there) and emits it.
- `notify` emits its payload back.

Build: componentize-py -d wit -w job-handler componentize app -o {{file}}.wasm
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import env, host, types

# Each running job's count (an instance may serve several jobs).
counts: dict[str, int] = {}


def request(what: str, call) -> None:
    """Makes a host request; a refusal ends the call with a retryable error."""
    try:
        call()
    except Err as refused:
        raise Err(types.JobError_Retryable(f"{what} refused: {refused.value!r}"))


class Handler(exports.Handler):
    def start(self, job: types.Job) -> None:
        state = job.state.decode(errors="replace") if job.state is not None else "0"
        count = int(state) if state.isdigit() else 0
        env.log(types.LogLevel.INFO, f"start {job.key} at {count}")
        request("emit", lambda: host.emit(job.key, b"hello " + job.payload))
        every = env.config("interval-ms") or "1000"
        if not every.isdigit():
            raise Err(types.JobError_Fatal(f"setting interval-ms = {every!r} is not a whole number"))
        request("set-timer", lambda: host.set_timer(job.key, "tick", int(every), True))
        counts[job.key] = count

    def stop(self, key: str) -> None:
        counts.pop(key, None)

    def notify(self, key: str, payload: bytes) -> None:
        request("emit", lambda: host.emit(key, payload))

    def on_timer(self, key: str, name: str) -> None:
        if key not in counts:
            raise Err(types.JobError_Fatal(f"tick for unknown job {key!r}"))
        counts[key] += 1
        text = str(counts[key]).encode()
        request("save-state", lambda: host.save_state(key, text))
        request("emit", lambda: host.emit(key, text))
