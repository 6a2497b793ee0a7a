// Package sdk serves the Replayguard browser SDK from files embedded in
// the binary: GET /sdk/replayguard.js (the classic script, minified),
// /sdk/replayguard.mjs (ES module entry), /sdk/replayguard.src.js (the
// readable source), /sdk/replayguard.min.js.map (the script's source map)
// and /sdk/replayguard.js.sri (the script's Subresource Integrity hash).
// The JavaScript goes out Brotli- or gzip-compressed as Accept-Encoding
// asks.
//
// The minified script, its map and its Brotli copy are built from
// replayguard.js by npm run build (build.mjs) and committed in dist/;
// go test fails when they are not what the current source builds to.
//
// Mount it on any router: handlers.Register does on Gin, and
//
//	mux.Handle("GET /sdk/", sdk.Handler())
//
// does on net/http; Paths lists the paths for routers that register them
// one by one. SRI is the hash to put in a page's <script integrity="…">.
package sdk
