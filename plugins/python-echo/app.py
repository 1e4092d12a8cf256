"""`python-echo`: the `echo` plugin in Python (componentize-py), with the
counter's timers and saved state, to show that a plugin in any language
with a WASI 0.2 toolchain serves the same contract.

- `start` logs the job and emits its payload (behind the `prefix`
  setting) as an output event.
- `notify` emits its payload back; the payload `trap` raises an exception
  nothing catches, which traps: the call fails and only this job ends.
- `stop` logs.
- With the setting `interval-ms`, it counts instead, like `counter`:
  `start` resumes the count from the saved state (or 0) and arms a
  repeating `tick` timer; each tick increments the count, saves it and
  emits it; `start` emits nothing then.

Build: `scripts/build-plugins` (componentize-py, from wit/job.wit).
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import env, host, types

# Running jobs of this instance (one per job in job isolation, shared by a
# worker's jobs in worker isolation): key -> count.
counts: dict[str, int] = {}


class Handler(exports.Handler):
    def start(self, job: types.Job) -> None:
        env.log(
            types.LogLevel.INFO,
            f"start {job.key} ({len(job.payload)} bytes, attempt {job.attempt}, "
            f"requeued {str(job.requeued).lower()})",
        )
        interval = env.config("interval-ms")
        if interval is None:
            echo(job.key, job.payload)
            return
        if not interval.isdigit():
            raise Err(types.JobError_Fatal(f"setting interval-ms must be a whole number, got {interval!r}"))
        state = job.state
        if state is not None and not state.decode(errors="replace").isdigit():
            raise Err(types.JobError_Fatal("saved state is not a count"))
        counts[job.key] = int(state) if state is not None else 0
        try:
            host.set_timer(job.key, "tick", int(interval), True)
        except Err as refused:
            raise Err(types.JobError_Retryable(f"set-timer refused: {refused.value!r}"))

    def stop(self, key: str) -> None:
        counts.pop(key, None)
        env.log(types.LogLevel.INFO, f"stop {key}")

    def notify(self, key: str, payload: bytes) -> None:
        if payload == b"trap":
            raise RuntimeError("trap requested")
        echo(key, payload)

    def on_timer(self, key: str, name: str) -> None:
        if name != "tick" or key not in counts:
            raise Err(types.JobError_InvalidInput(f"no timer {name!r} is armed for {key!r}"))
        counts[key] += 1
        value = str(counts[key]).encode()
        try:
            host.save_state(key, value)
            host.emit(key, value)
        except Err as refused:
            raise Err(types.JobError_Retryable(f"refused: {refused.value!r}"))


def echo(key: str, payload: bytes) -> None:
    """Emits `payload`, behind the configured prefix, for `key`."""
    prefix = (env.config("prefix") or "").encode()
    try:
        host.emit(key, prefix + payload)
    except Err as refused:
        # The job cannot do its one task: say so rather than pretend.
        raise Err(types.JobError_Retryable(f"emit refused: {refused.value!r}"))
