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

Written on the Python SDK (`sdk/python/pulse_plugin.py`). Build:
`scripts/build-plugins` (componentize-py, from wit/job.wit, with `-p
sdk/python`).
"""

from wit_world import exports

import pulse_plugin as pulse

# Running jobs of this instance (one per job in job isolation, shared by a
# worker's jobs in worker isolation): key -> count.
counts: dict[str, int] = {}


class Handler(exports.Handler):
    def start(self, job: pulse.Job) -> None:
        requeued = str(job.requeued).lower()
        pulse.info(f"start {job.key} ({len(job.payload)} bytes, attempt {job.attempt}, requeued {requeued})")
        if pulse.setting("interval-ms") is None:
            echo(job.key, job.payload)
            return
        interval = pulse.setting_int("interval-ms", 0)
        count = pulse.parse_number(job.state)
        if job.state is not None and count is None:
            raise pulse.fatal("saved state is not a count")
        counts[job.key] = count or 0
        pulse.set_timer(job.key, "tick", interval, repeat=True)

    def stop(self, key: str) -> None:
        counts.pop(key, None)
        pulse.info(f"stop {key}")

    def notify(self, key: str, payload: bytes) -> None:
        if payload == b"trap":
            raise RuntimeError("trap requested")
        echo(key, payload)

    def on_timer(self, key: str, name: str) -> None:
        if name != "tick" or key not in counts:
            raise pulse.invalid_input(f"no timer {name!r} is armed for {key!r}")
        counts[key] += 1
        value = str(counts[key]).encode()
        pulse.save_state(key, value)
        pulse.emit(key, value)


def echo(key: str, payload: bytes) -> None:
    """Emits `payload`, behind the configured prefix, for `key`."""
    pulse.emit(key, (pulse.setting("prefix") or "").encode() + payload)
