package replay

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"maps"
	"sync"
	"sync/atomic"
)

// scratch is the memory one Verify works in, recycled through scratches
// so that a verification allocates little: the parsed Signature-Input
// members, the decoded signature and digests, the signature base.
type scratch struct {
	b64     b64Decoder
	base    []byte
	sig     [96]byte // an Ed25519 signature is 64 bytes, HMAC-SHA256 32
	mac     [32]byte // the HMAC-SHA256 computed
	digest  [72]byte // a SHA-512 digest is 64 bytes
	inputs  []inputMember
	members [4]inputMember
	comps   [16]component
	params  [8]sfParam
	digests [4]digestMember
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// maxScratchBuf bounds the buffers a scratch keeps for the next
// verification.
const maxScratchBuf = 16 << 10

// release forgets what sc points to (the request's fields) and gives it
// back.
func (sc *scratch) release() {
	clear(sc.inputs) // may have outgrown members
	sc.inputs = nil
	clear(sc.members[:])
	clear(sc.comps[:])
	clear(sc.params[:])
	clear(sc.digests[:])
	if cap(sc.base) > maxScratchBuf {
		sc.base = nil
	}
	if cap(sc.b64.text) > maxScratchBuf {
		sc.b64.text = nil
	}
	scratches.Put(sc)
}

// macCache keeps a pool of keyed HMAC-SHA256 states per secret, as
// token's macPool does per key: keying one costs two SHA-256 blocks and
// several allocations. The zero macCache is empty and ready; the map is
// copied on write, so lookups take no lock. A Verifier holds a pointer
// to one, so that Verifiers stay copyable.
type macCache struct {
	pools atomic.Pointer[map[string]*sync.Pool]
	mu    sync.Mutex // serialises writers
}

// maxMACPools bounds a macCache: past it (key files reloaded many times
// over), it starts afresh and old secrets are forgotten.
const maxMACPools = 256

// sum appends the HMAC-SHA256 of msg under secret to b. A nil
// macCache keys a new state each time.
func (c *macCache) sum(secret, msg, b []byte) []byte {
	if c == nil {
		h := hmac.New(sha256.New, secret)
		h.Write(msg)
		return h.Sum(b)
	}
	p := c.pool(secret)
	h := p.Get().(hash.Hash)
	h.Reset()
	h.Write(msg)
	b = h.Sum(b)
	p.Put(h)
	return b
}

// pool returns the pool of states keyed with secret.
func (c *macCache) pool(secret []byte) *sync.Pool {
	if m := c.pools.Load(); m != nil {
		if p := (*m)[string(secret)]; p != nil {
			return p
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.pools.Load()
	if old != nil {
		if p := (*old)[string(secret)]; p != nil {
			return p
		}
	}
	next := map[string]*sync.Pool{}
	if old != nil && len(*old) < maxMACPools {
		next = maps.Clone(*old)
	}
	key := string(secret) // a copy: the caller's slice may change
	p := &sync.Pool{New: func() any { return hmac.New(sha256.New, []byte(key)) }}
	next[key] = p
	c.pools.Store(&next)
	return p
}
