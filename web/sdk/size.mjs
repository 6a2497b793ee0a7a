// Measures the SDK as shipped over the wire: esbuild --minify, then gzip -9.
// Usage: node size.mjs [--budget N] — exits 1 when over the budget.
import { readFileSync } from 'node:fs';
import { gzipSync } from 'node:zlib';
import { transform } from 'esbuild';

const budget = Number(process.argv[process.argv.indexOf('--budget') + 1]) || 3072;
const src = readFileSync(new URL('./replayguard.js', import.meta.url), 'utf8');
const { code } = await transform(src, { minify: true, loader: 'js' });
const gz = gzipSync(code, { level: 9 }).length;
console.log(JSON.stringify({ source: Buffer.byteLength(src), minified: Buffer.byteLength(code), gzip: gz, budget }));
const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
if (!readme.includes(`**${gz} bytes**`)) {
  console.error(`README.md must print the current size: **${gz} bytes**`);
  process.exitCode = 1;
}
if (gz > budget) {
  console.error(`replayguard.js is ${gz} bytes minified and gzipped, over the budget of ${budget}`);
  process.exit(1);
}
