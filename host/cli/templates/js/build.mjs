// Builds app.js into {{file}}.wasm, a component of wit/job.wit's
// `job-handler` world.
import { componentize } from '@bytecodealliance/componentize-js';
import { writeFile } from 'node:fs/promises';

// No HTTP: a plugin reaches the world through wasi:http only when allowed.
const { component } = await componentize({
  sourcePath: 'app.js',
  witPath: 'wit',
  worldName: 'job-handler',
  disableFeatures: ['http', 'fetch-event'],
});
await writeFile('{{file}}.wasm', component);
