package idempotency

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
)

// Replayable reports whether a response header named name (in canonical
// form) is worth storing in an Outcome and replaying: cookies belong to
// the first caller, Date to the first answer, and hop-by-hop headers to
// its connection, so they are not.
func Replayable(name string) bool { return !unreplayed[name] }

var unreplayed = map[string]bool{
	"Set-Cookie": true, "Date": true, "Connection": true, "Keep-Alive": true,
	"Proxy-Connection": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	ReplayedHeader: true,
}

// MarshalBinary returns the stored form of o, the bytes a record keeps:
// for stores that live elsewhere than a store.Store, such as a record
// written in the application's own transaction (package idempotency/pgtx).
func (o Outcome) MarshalBinary() ([]byte, error) { return encodeOutcome(o), nil }

// UnmarshalBinary reads the stored form MarshalBinary wrote; bytes that
// are not one are ErrCorrupt.
func (o *Outcome) UnmarshalBinary(data []byte) error {
	out, err := decodeOutcome(data)
	if err != nil {
		return err
	}
	*o = out
	return nil
}

// The stored form of an Outcome, opaque to the store:
//
//	version byte (1) | flags byte (1 = body omitted) |
//	uvarint status | uvarint header count |
//	per header, in name order: uvarint len, name, uvarint value count,
//	  per value: uvarint len, value |
//	body (the rest)
const (
	outcomeVersion  = 1
	flagBodyOmitted = 1
)

func encodeOutcome(o Outcome) []byte {
	names := make([]string, 0, len(o.Header))
	n := 2 + 2*binary.MaxVarintLen64 + len(o.Body)
	for name, vs := range o.Header {
		names = append(names, name)
		n += 2*binary.MaxVarintLen64 + len(name)
		for _, v := range vs {
			n += binary.MaxVarintLen64 + len(v)
		}
	}
	sort.Strings(names)
	b := make([]byte, 0, n)
	var flags byte
	if o.BodyOmitted {
		flags |= flagBodyOmitted
	}
	b = append(b, outcomeVersion, flags)
	b = binary.AppendUvarint(b, uint64(max(o.Status, 0)))
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendString(b, name)
		vs := o.Header[name]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return append(b, o.Body...)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decoder reads the stored form; the first failure sticks.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.bad || n > uint64(len(d.b)) {
		d.bad = true
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func decodeOutcome(data []byte) (Outcome, error) {
	if len(data) < 2 || data[0] != outcomeVersion {
		return Outcome{}, corrupt(data)
	}
	o := Outcome{BodyOmitted: data[1]&flagBodyOmitted != 0}
	d := decoder{b: data[2:]}
	o.Status = int(d.uvarint())
	nh := d.uvarint()
	if nh > uint64(len(d.b)) { // every header takes at least one byte
		return Outcome{}, corrupt(data)
	}
	if nh > 0 {
		o.Header = make(map[string][]string, nh)
	}
	for i := uint64(0); i < nh && !d.bad; i++ {
		name := d.string()
		nv := d.uvarint()
		if nv > uint64(len(d.b)) {
			return Outcome{}, corrupt(data)
		}
		vs := make([]string, 0, nv)
		for j := uint64(0); j < nv && !d.bad; j++ {
			vs = append(vs, d.string())
		}
		o.Header[name] = vs
	}
	if d.bad {
		return Outcome{}, corrupt(data)
	}
	if len(d.b) > 0 {
		o.Body = bytes.Clone(d.b) // the store may hand every reader one slice
	}
	return o, nil
}

func corrupt(data []byte) error {
	return fmt.Errorf("%w: %d bytes that are not a version %d outcome", ErrCorrupt, len(data), outcomeVersion)
}
