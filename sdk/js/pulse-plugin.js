// pulse-plugin: write a pulse-host job handler in JavaScript
// (componentize-js).
//
// The same helpers as the Rust SDK (sdk/rust), over the imports
// componentize-js gives from wit/job.wit (world `job-handler`). A host
// refusal becomes a job error the call throws, so a handler reads
// straight:
//
//   import * as pulse from './pulse-plugin.js';
//
//   export const handler = {
//     start(job) { pulse.info(`start ${job.key}`); pulse.emit(job.key, job.payload); },
//     stop(key) {},
//     notify(key, payload) { pulse.emit(key, payload); },
//     onTimer(key, name) {},
//   };
//
// What a call writes (`emit`, `saveState`, `complete`) is written when the
// call returns, in one step with its answer, or not at all.

import { config, fence as jobFence, log } from 'pulse:job/env@0.1.0';
import { cancelTimer as cancel, complete as done, emit as publish, saveState as save, setTimer as arm } from 'pulse:job/host@0.1.0';

/**
 * A job as `start` receives it.
 * @typedef {{ key: string, payload: Uint8Array, createdAtMs: bigint, requeued: boolean, attempt: number, state?: Uint8Array }} Job
 */

/**
 * A job error, thrown to end a call: `invalid-input` refuses the job,
 * `retryable` starts it again later, `fatal` fails it.
 * @typedef {{ tag: 'invalid-input' | 'retryable' | 'fatal', val: string }} JobError
 */

/** @param {string} message @returns {JobError} */
export const invalidInput = (message) => ({ tag: 'invalid-input', val: message });
/** @param {string} message @returns {JobError} */
export const retryable = (message) => ({ tag: 'retryable', val: message });
/** @param {string} message @returns {JobError} */
export const fatal = (message) => ({ tag: 'fatal', val: message });

/**
 * Makes a host request; a refusal ends the call: the job moved away or a
 * limit was passed (fatal), or Redis cannot be reached (retryable).
 * @template T
 * @param {string} what
 * @param {() => T} call
 * @returns {T}
 */
function request(what, call) {
  try {
    return call();
  } catch (refused) {
    const error = refused.payload ?? refused;
    if (error.tag === 'unavailable') throw retryable(`${what}: unavailable: ${error.val}`);
    if (error.tag === 'limit-exceeded') throw fatal(`${what}: limit exceeded: ${error.val}`);
    throw fatal(`${what}: the job is no longer owned here`);
  }
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Bytes of `value`: a string is encoded as UTF-8. @param {Uint8Array | string} value */
export const bytes = (value) => (typeof value === 'string' ? encoder.encode(value) : value);

/** Publishes an event of job `key`. @param {string} key @param {Uint8Array | string} payload */
export function emit(key, payload) {
  request('emit', () => publish(key, bytes(payload)));
}

/** Stores job `key`'s state for its next start. @param {string} key @param {Uint8Array | string} state */
export function saveState(key, state) {
  request('save-state', () => save(key, bytes(state)));
}

/** Job `key` finished by itself: the host removes it. @param {string} key */
export function complete(key) {
  request('complete', () => done(key));
}

/**
 * Arms timer `name` of job `key` (again every `delayMs` when `repeat`);
 * timers live with the instance: re-arm them in `start`.
 * @param {string} key @param {string} name @param {number} delayMs @param {boolean} [repeat]
 */
export function setTimer(key, name, delayMs, repeat = false) {
  request('set-timer', () => arm(key, name, BigInt(delayMs), repeat));
}

/** Disarms timer `name` of job `key`; whether one was armed. @param {string} key @param {string} name @returns {boolean} */
export const cancelTimer = (key, name) => cancel(key, name);

/** The plugin's setting `name`, if set. @param {string} name @returns {string | undefined} */
export const setting = (name) => config(name);

/**
 * Setting `name` as a whole number, `fallback` when unset; a value that is
 * not one fails the job, naming the setting.
 * @param {string} name @param {number} fallback @returns {number}
 */
export function settingInt(name, fallback) {
  const text = config(name);
  if (text === undefined) return fallback;
  if (!/^\d+$/.test(text.trim())) throw fatal(`setting ${name} = ${JSON.stringify(text)} is not a whole number`);
  return Number(text);
}

/**
 * A whole number written as decimal text (a payload, a saved count).
 * @param {Uint8Array | undefined} data @returns {number | undefined}
 */
export function parseNumber(data) {
  if (data === undefined) return undefined;
  const text = decoder.decode(data).trim();
  return /^\d+$/.test(text) ? Number(text) : undefined;
}

/** Text of `data` (UTF-8). @param {Uint8Array} data @returns {string} */
export const text = (data) => decoder.decode(data);

/** The pool, key and fencing token of the job whose call runs. @returns {{ pool: string, key: string, token: bigint } | undefined} */
export const fence = () => jobFence();

/** @param {string} message */
export const debug = (message) => log('debug', message);
/** @param {string} message */
export const info = (message) => log('info', message);
/** @param {string} message */
export const warn = (message) => log('warn', message);
/** @param {string} message */
export const error = (message) => log('error', message);
