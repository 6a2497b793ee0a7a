//go:build race

package replay

// The race detector makes sync.Pool drop what it is given at random, so
// allocation counts mean nothing under it.
func init() { raceEnabled = true }
