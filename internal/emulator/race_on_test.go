//go:build race

package emulator

// raceEnabled: the race detector slows the driver and the replayer several
// times over, so timing against the simulator means nothing under it.
const raceEnabled = true
