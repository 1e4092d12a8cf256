"""`{{name}}`: a pulse-host job handler in Python (componentize-py).

- `start` emits `hello <payload>`, resumes its count from the saved state
  (or 0) and arms a `tick` timer every `interval-ms` (setting; default
  1000).
- Each tick adds one to the count, saves it (a move or a crash resumes
  from there) and emits it.
- `notify` emits its payload back.

Build: componentize-py -d wit -w job-handler componentize app -o {{file}}.wasm
"""

from wit_world import exports

import pulse_plugin as pulse

# Each running job's count (an instance may serve several jobs).
counts: dict[str, int] = {}


class Handler(exports.Handler):
    def start(self, job: pulse.Job) -> None:
        count = pulse.parse_number(job.state) or 0
        pulse.info(f"start {job.key} at {count}")
        pulse.emit(job.key, b"hello " + job.payload)
        pulse.set_timer(job.key, "tick", pulse.setting_int("interval-ms", 1000), repeat=True)
        counts[job.key] = count

    def stop(self, key: str) -> None:
        counts.pop(key, None)

    def notify(self, key: str, payload: bytes) -> None:
        pulse.emit(key, payload)

    def on_timer(self, key: str, name: str) -> None:
        if key not in counts:
            raise pulse.fatal(f"tick for unknown job {key!r}")
        counts[key] += 1
        text = str(counts[key]).encode()
        pulse.save_state(key, text)
        pulse.emit(key, text)
