// Checks the npm package as a user gets it: packs web/sdk with npm pack,
// requires its file list to be exactly FILES, installs the tarball into a
// scratch project (offline: the package has no dependencies) and there
// imports every entry point under Node and type-checks a TypeScript user of
// them with the tsc of our devDependencies.
// Usage: node pack-check.mjs (npm run pack:check); exits 1 on a failure.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

const here = fileURLToPath(new URL('.', import.meta.url));
const pkg = JSON.parse(readFileSync(join(here, 'package.json'), 'utf8'));

// What a user needs, and nothing else (no tests, build scripts or dist/:
// bundlers minify themselves, and pages load the minified script from the
// server). npm adds package.json and README.md on its own.
const FILES = [
  'README.md',
  'package.json',
  'replayguard.d.ts',
  'replayguard.js',
  'replayguard.mjs',
  'signer.d.mts',
  'signer.mjs',
];

/**
 * @param {string} cmd
 * @param {string[]} args
 * @param {string} cwd
 */
function run(cmd, args, cwd) {
  try {
    return execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (e) {
    const { stdout, stderr } = /** @type {{stdout: string, stderr: string}} */ (e);
    throw new Error(`${cmd} ${args.join(' ')} (in ${cwd}) failed:\n${stdout}${stderr}`);
  }
}

const tmp = mkdtempSync(join(tmpdir(), 'replayguard-sdk-pack-'));
try {
  const [packed] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', tmp], here));
  const files = packed.files.map((/** @type {{path: string}} */ f) => f.path).sort();
  assert.deepEqual(files, FILES, 'the tarball holds other files than package.json "files" intends');
  assert.equal(packed.name, pkg.name);
  assert.ok(!pkg.private, 'package.json must not be private');

  const user = join(tmp, 'user');
  mkdirSync(user);
  writeFileSync(join(user, 'package.json'), JSON.stringify({ name: 'user', private: true, type: 'module' }));
  run('npm', ['install', '--offline', '--no-audit', '--no-fund', '--ignore-scripts', '--loglevel=error', join(tmp, packed.filename)], user);

  // Node: the entry points resolve through "exports" and load outside a
  // browser (the SDK defines globalThis.ReplayGuard and its helpers, and
  // touches no DOM without a document).
  writeFileSync(join(user, 'node.mjs'), `
import assert from 'node:assert/strict';
import ReplayGuard, { ReplayGuard as named } from '${pkg.name}';
import '${pkg.name}/replayguard.js';
import { createSignedFetch, signRequest } from '${pkg.name}/signer';
assert.equal(ReplayGuard, globalThis.ReplayGuard);
assert.equal(named, ReplayGuard);
assert.equal(typeof ReplayGuard.fetch, 'function');
assert.equal(ReplayGuard.version, '${pkg.version}', 'ReplayGuard.version and package.json "version" differ');
assert.equal(typeof createSignedFetch, 'function');
const h = await signRequest({ method: 'POST', url: 'https://api.example/v1/orders', body: '{}' },
  { keyId: 'k', alg: 'hmac-sha256', key: new Uint8Array(32) });
assert.match(h['Signature-Input'], /keyid="k"/);
`);
  run(process.execPath, ['node.mjs'], user);

  // TypeScript: the declarations resolve through "exports", for bundlers
  // and for Node's own resolution.
  writeFileSync(join(user, 'user.ts'), `
import ReplayGuard from '${pkg.name}';
import '${pkg.name}/replayguard.js';
import { createSignedFetch } from '${pkg.name}/signer';
const version: string = ReplayGuard.version;
const cfg = window.ReplayGuard.configure({ guard: 500 });
const retries: number = cfg.retries;
const signed: (input: RequestInfo | URL, init?: RequestInit) => Promise<Response> =
  createSignedFetch({ keyId: 'k', alg: 'hmac-sha256', key: new Uint8Array(32) });
document.addEventListener('replayguard:error', (e) => console.log(e.detail.reason, version, retries, signed));
`);
  const tsc = join(here, 'node_modules', 'typescript', 'bin', 'tsc');
  for (const [module, moduleResolution] of [['esnext', 'bundler'], ['nodenext', 'nodenext']]) {
    writeFileSync(join(user, 'tsconfig.json'), JSON.stringify({
      compilerOptions: {
        noEmit: true, strict: true, target: 'es2020', lib: ['es2020', 'dom', 'dom.iterable'], types: [],
        module, moduleResolution,
      },
      files: ['user.ts'],
    }));
    run(process.execPath, [tsc, '-p', 'tsconfig.json'], user);
  }
  console.log(`ok: ${packed.filename}: ${files.join(' ')}`);
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
