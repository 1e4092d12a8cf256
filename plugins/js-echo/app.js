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
// Build: `scripts/build-plugins` (componentize-js, from wit/job.wit).

import { config, log } from 'pulse:job/env@0.1.0';
import { emit, saveState, setTimer } from 'pulse:job/host@0.1.0';

// Running jobs of this instance: key -> count.
const counts = new Map();
const encoder = new TextEncoder();
const decoder = new TextDecoder();

// A job error: the `err` of the call's result.
function jobError(tag, message) {
  return { tag, val: message };
}

// Calls `request`, a host function; its refusal becomes a retryable error.
function hostCall(what, request) {
  try {
    request();
  } catch (refused) {
    throw jobError('retryable', `${what} refused: ${JSON.stringify(refused.payload ?? refused)}`);
  }
}

// Emits `payload`, behind the configured prefix, for `key`.
function echo(key, payload) {
  const prefix = encoder.encode(config('prefix') ?? '');
  const out = new Uint8Array(prefix.length + payload.length);
  out.set(prefix, 0);
  out.set(payload, prefix.length);
  hostCall('emit', () => emit(key, out));
}

export const handler = {
  start(job) {
    log('info', `start ${job.key} (${job.payload.length} bytes, attempt ${job.attempt}, requeued ${job.requeued})`);
    const interval = config('interval-ms');
    if (interval === undefined) {
      echo(job.key, job.payload);
      return;
    }
    if (!/^\d+$/.test(interval)) {
      throw jobError('fatal', `setting interval-ms must be a whole number, got ${JSON.stringify(interval)}`);
    }
    const saved = job.state === undefined ? '0' : decoder.decode(job.state);
    if (!/^\d+$/.test(saved)) {
      throw jobError('fatal', 'saved state is not a count');
    }
    counts.set(job.key, Number(saved));
    hostCall('set-timer', () => setTimer(job.key, 'tick', BigInt(interval), true));
  },

  stop(key) {
    counts.delete(key);
    log('info', `stop ${key}`);
  },

  notify(key, payload) {
    if (decoder.decode(payload) === 'trap') {
      throw new Error('trap requested');
    }
    echo(key, payload);
  },

  onTimer(key, name) {
    if (name !== 'tick' || !counts.has(key)) {
      throw jobError('invalid-input', `no timer ${JSON.stringify(name)} is armed for ${JSON.stringify(key)}`);
    }
    const value = counts.get(key) + 1;
    counts.set(key, value);
    const bytes = encoder.encode(String(value));
    hostCall('save-state', () => saveState(key, bytes));
    hostCall('emit', () => emit(key, bytes));
  },
};
