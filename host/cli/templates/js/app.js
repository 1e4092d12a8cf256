// `{{name}}`: a pulse-host job handler in JavaScript (componentize-js).
//
// - `start` emits `hello <payload>`, resumes its count from the saved state
//   (or 0) and arms a `tick` timer every `interval-ms` (setting; default
//   1000).
// - Each tick adds one to the count, saves it (a move or a crash resumes
//   from there) and emits it.
// - `notify` emits its payload back.
//
// Build: npm install && npm run build

import * as pulse from './pulse-plugin.js';

/** Each running job's count (an instance may serve several jobs). */
const counts = new Map();

export const handler = {
  /** @param {import('./pulse-plugin.js').Job} job */
  start(job) {
    const count = pulse.parseNumber(job.state) ?? 0;
    pulse.info(`start ${job.key} at ${count}`);
    pulse.emit(job.key, `hello ${pulse.text(job.payload)}`);
    pulse.setTimer(job.key, 'tick', pulse.settingInt('interval-ms', 1000), true);
    counts.set(job.key, count);
  },

  stop(key) {
    counts.delete(key);
  },

  notify(key, payload) {
    pulse.emit(key, payload);
  },

  onTimer(key, _name) {
    if (!counts.has(key)) {
      throw pulse.fatal(`tick for unknown job ${JSON.stringify(key)}`);
    }
    const count = counts.get(key) + 1;
    counts.set(key, count);
    pulse.saveState(key, String(count));
    pulse.emit(key, String(count));
  },
};
