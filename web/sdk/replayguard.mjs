// ES-module entry: runs replayguard.js once and re-exports the object it
// defines, so `import ReplayGuard from './replayguard.mjs'` and
// window.ReplayGuard are the same object and the code exists once.
import './replayguard.js';

/** @type {import('./replayguard').ReplayGuardStatic} */
const ReplayGuard = /** @type {any} */ (globalThis).ReplayGuard;
export default ReplayGuard;
export { ReplayGuard };
