package admin

import (
	"testing"

	"github.com/gorgo-llm/gorgo/internal/router"
)

// An operator reads a replica's state in one word: a replica a client
// put to sleep reads "asleep" (while up and probed).
func TestStateWords(t *testing.T) {
	for _, c := range []struct {
		st   router.ReplicaState
		want string
	}{
		{router.ReplicaState{State: router.Active, Healthy: true, Probed: true}, "active"},
		{router.ReplicaState{State: router.Active, Healthy: true, Probed: true, Asleep: true}, "asleep"},
		{router.ReplicaState{State: router.Active, Healthy: false, Probed: true, Asleep: true}, "down"},
		{router.ReplicaState{State: router.Draining, Healthy: true, Probed: true, Asleep: true}, "draining"},
		{router.ReplicaState{State: router.Active, Healthy: true}, "unprobed"},
	} {
		if got := state(c.st); got != c.want {
			t.Errorf("%+v: %q, want %q", c.st, got, c.want)
		}
	}
}
