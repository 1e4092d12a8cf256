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

import { config, log } from 'pulse:job/env@0.1.0';
import { emit, saveState, setTimer } from 'pulse:job/host@0.1.0';

/** Each running job's count (an instance may serve several jobs). */
const counts = new Map();
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * Makes a host request; a refusal ends the call with a retryable error.
 * @param {string} what
 * @param {() => void} call
 */
function request(what, call) {
  try {
    call();
  } catch (refused) {
    throw { tag: 'retryable', val: `${what} refused: ${JSON.stringify(refused.payload ?? refused)}` };
  }
}

export const handler = {
  start(job) {
    const state = job.state === undefined ? '0' : decoder.decode(job.state);
    const count = /^\d+$/.test(state) ? Number(state) : 0;
    log('info', `start ${job.key} at ${count}`);
    const hello = encoder.encode('hello ');
    const out = new Uint8Array(hello.length + job.payload.length);
    out.set(hello, 0);
    out.set(job.payload, hello.length);
    request('emit', () => emit(job.key, out));
    const every = config('interval-ms') ?? '1000';
    if (!/^\d+$/.test(every)) {
      throw { tag: 'fatal', val: `setting interval-ms = ${JSON.stringify(every)} is not a whole number` };
    }
    request('set-timer', () => setTimer(job.key, 'tick', BigInt(every), true));
    counts.set(job.key, count);
  },

  stop(key) {
    counts.delete(key);
  },

  notify(key, payload) {
    request('emit', () => emit(key, payload));
  },

  onTimer(key, _name) {
    if (!counts.has(key)) {
      throw { tag: 'fatal', val: `tick for unknown job ${JSON.stringify(key)}` };
    }
    const count = counts.get(key) + 1;
    counts.set(key, count);
    const text = encoder.encode(String(count));
    request('save-state', () => saveState(key, text));
    request('emit', () => emit(key, text));
  },
};
