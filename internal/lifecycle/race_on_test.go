//go:build race

package lifecycle

// raceEnabled: under the race detector sync.Pool drops what it is given at
// random, so pooled requests are allocated anew: no allocation count holds.
const raceEnabled = true
