// `js-echo`: the `echo` plugin in JavaScript (componentize-js), with the
// counter's timers and saved state, to show that a plugin in any language
// with a WASI 0.2 toolchain serves the same contract.
//
// - `start` logs the job and emits its payload (behind the `prefix`
//   setting) as an output event.
// - `notify` emits its payload back; the payload `trap` throws an error
//   that is not a job error, which traps: the call fails and only this
//   job ends.
// - `stop` logs.
// - With the setting `interval-ms`, it counts instead, like `counter`:
//   `start` resumes the count from the saved state (or 0) and arms a
//   repeating `tick` timer; each tick increments the count, saves it and
//   emits it; `start` emits nothing then.
//
// Written on the JavaScript SDK (sdk/js/pulse-plugin.js). Build:
// `scripts/build-plugins` (componentize-js, from wit/job.wit).

import * as pulse from '../../sdk/js/pulse-plugin.js';

// Running jobs of this instance: key -> count.
const counts = new Map();

// Emits `payload`, behind the configured prefix, for `key`.
function echo(key, payload) {
  const prefix = pulse.bytes(pulse.setting('prefix') ?? '');
  const out = new Uint8Array(prefix.length + payload.length);
  out.set(prefix, 0);
  out.set(payload, prefix.length);
  pulse.emit(key, out);
}

export const handler = {
  /** @param {import('../../sdk/js/pulse-plugin.js').Job} job */
  start(job) {
    pulse.info(`start ${job.key} (${job.payload.length} bytes, attempt ${job.attempt}, requeued ${job.requeued})`);
    if (pulse.setting('interval-ms') === undefined) {
      echo(job.key, job.payload);
      return;
    }
    const interval = pulse.settingInt('interval-ms', 0);
    const count = job.state === undefined ? 0 : pulse.parseNumber(job.state);
    if (count === undefined) {
      throw pulse.fatal('saved state is not a count');
    }
    counts.set(job.key, count);
    pulse.setTimer(job.key, 'tick', interval, true);
  },

  stop(key) {
    counts.delete(key);
    pulse.info(`stop ${key}`);
  },

  notify(key, payload) {
    if (pulse.text(payload) === 'trap') {
      throw new Error('trap requested');
    }
    echo(key, payload);
  },

  onTimer(key, name) {
    if (name !== 'tick' || !counts.has(key)) {
      throw pulse.invalidInput(`no timer ${JSON.stringify(name)} is armed for ${JSON.stringify(key)}`);
    }
    const value = counts.get(key) + 1;
    counts.set(key, value);
    pulse.saveState(key, String(value));
    pulse.emit(key, String(value));
  },
};
