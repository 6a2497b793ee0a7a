// Package sdk serves the Replayguard browser SDK from files embedded in
// the binary: GET /sdk/replayguard.js (classic script),
// /sdk/replayguard.mjs (ES module entry) and /sdk/replayguard.js.sri
// (the script's Subresource Integrity hash).
//
// Mount it on any router: handlers.Register does on Gin, and
//
//	mux.Handle("GET /sdk/", sdk.Handler())
//
// does on net/http. SRI is the hash to put in a page's <script
// integrity="…">.
package sdk
