// Builds what the server sends for /sdk/replayguard.js from replayguard.js,
// the readable source: esbuild --minify with a source map, and a Brotli copy.
// The outputs are committed in dist/ and embedded by sdk.go, which gzips at
// start; Go links no minifier and no Brotli encoder.
//
//   node build.mjs          (npm run build) writes dist/ and prints the sizes
//   node build.mjs --check  (npm run build:check) writes nothing; fails unless
//                           dist/ is what the current source builds to
//
// dist/replayguard.min.js       the minified script, ending in a
//                               sourceMappingURL comment; SRI hashes this file
// dist/replayguard.min.js.map   its source map: the source is named
//                               replayguard.src.js, the path the server serves
//                               the readable file at, and is inlined
//                               (sourcesContent), so a copy works anywhere
// dist/replayguard.min.js.br    the minified script, Brotli quality 11
//
// --check compares the script and the map byte for byte (esbuild is pinned
// in package-lock.json) and requires the .br to decode to the script: Brotli
// encoders of other Node versions may choose other bytes for the same text.
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { brotliCompressSync, brotliDecompressSync, gzipSync, constants } from 'node:zlib';
import { transform } from 'esbuild';

const dir = new URL('./dist/', import.meta.url);
const MIN = 'replayguard.min.js';
const MAP = MIN + '.map';
const BR = MIN + '.br';
// The path, relative to the served script, that serves the readable source.
const SOURCE_NAME = 'replayguard.src.js';
// Bytes on the wire for the minified script, gzipped (-9) or Brotli.
const BUDGET = 3072;

const src = readFileSync(new URL('./replayguard.js', import.meta.url), 'utf8');
const built = await transform(src, {
  loader: 'js',
  minify: true,
  // jsconfig.json's target: the minifier may not emit newer syntax than the source may use.
  target: 'es2020',
  sourcemap: 'external',
  sourcefile: SOURCE_NAME,
});
const min = Buffer.from(`${built.code}//# sourceMappingURL=${MAP}\n`);
const map = Buffer.from(built.map);

/** @param {Buffer} b */
function brotli(b) {
  return brotliCompressSync(b, {
    params: {
      [constants.BROTLI_PARAM_QUALITY]: constants.BROTLI_MAX_QUALITY,
      [constants.BROTLI_PARAM_MODE]: constants.BROTLI_MODE_TEXT,
      [constants.BROTLI_PARAM_SIZE_HINT]: b.length,
    },
  });
}

/** @param {string} name */
function committed(name) {
  try {
    return readFileSync(new URL(name, dir));
  } catch {
    return null;
  }
}

const problems = [];
let br;
if (process.argv.includes('--check')) {
  for (const [name, want] of [[MIN, min], [MAP, map]]) {
    const got = committed(name);
    if (!got || !got.equals(want)) problems.push(`dist/${name} is not what replayguard.js builds to`);
  }
  br = committed(BR);
  let decoded = null;
  try {
    decoded = br && brotliDecompressSync(br);
  } catch {}
  if (!decoded || !decoded.equals(min)) problems.push(`dist/${BR} does not decode to the built script`);
  if (problems.length) problems.push('run npm run build in web/sdk and commit dist/');
} else {
  br = brotli(min);
  mkdirSync(dir, { recursive: true });
  writeFileSync(new URL(MIN, dir), min);
  writeFileSync(new URL(MAP, dir), map);
  writeFileSync(new URL(BR, dir), br);
}

const sizes = {
  source: Buffer.byteLength(src),
  minified: min.length,
  gzip: gzipSync(min, { level: 9 }).length, // zlib's; the server's Go gzip may differ by a few bytes
  br: br ? br.length : 0,
  budget: BUDGET,
};
console.log(JSON.stringify(sizes));
for (const k of /** @type {const} */ (['gzip', 'br'])) {
  if (sizes[k] > BUDGET) problems.push(`the minified script is ${sizes[k]} bytes with ${k}, over the budget of ${BUDGET}`);
}
for (const p of problems) console.error(p);
if (problems.length) process.exitCode = 1;
