//go:build race

package proxy

// raceEnabled: the race detector makes every copy slow, so the hostile
// replicas' answers are smaller under it.
const raceEnabled = true
