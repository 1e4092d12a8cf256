"""`python-keeper`: the `keeper` job producer in Python (componentize-py),
world `job-producer`: it keeps one job running per entry of a list.

Settings (in the schedule's `settings`):
- `jobs`: the list, entries separated by commas, each `key` or
  `key=payload` (the payload defaults to the key). Each tick the plan is
  "these jobs, and nothing else this schedule started".
- `finished`: "true" ends the schedule (the answer `finished`).

Without `jobs` the producer answers `failed`, which the host logs and asks
again at the next tick.

Build: `scripts/build-plugins` (componentize-py, from wit/job.wit).
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports import producer
from wit_world.imports import env, types


class Producer(exports.Producer):
    def plan(self) -> producer.JobPlan:
        if env.config("finished") == "true":
            env.log(types.LogLevel.INFO, "finished: the schedule ends")
            raise Err(producer.ProducerError_Finished())
        listed = env.config("jobs")
        if listed is None:
            raise Err(producer.ProducerError_Failed("the setting `jobs` is missing: a comma-separated list of keys"))
        start = []
        for entry in (entry.strip() for entry in listed.split(",")):
            if not entry:
                continue
            key, _, payload = entry.partition("=")
            key = key.strip()
            payload = payload.strip() if payload else key
            start.append(producer.JobSpec(key=key, payload=payload.encode()))
        env.log(types.LogLevel.DEBUG, f"plan: {len(start)} job(s)")
        return producer.JobPlan(start=start, stop=[], stop_all=True)
