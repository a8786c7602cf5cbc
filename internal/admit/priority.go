package admit

import (
	"fmt"
	"strconv"
	"strings"
)

// The named priorities, highest first. Any integer is a priority too;
// below 0 a request is sheddable.
const (
	Interactive = 30
	Standard    = 20
	Batch       = 10
	Sheddable   = -10
)

// MaxPriority bounds the integers a priority may be, either way.
const MaxPriority = 1000

var priorityNames = []struct {
	name string
	p    int
}{{"interactive", Interactive}, {"standard", Standard}, {"batch", Batch}, {"sheddable", Sheddable}}

// ParsePriority reads a priority: a name (interactive, standard, batch,
// sheddable) or an integer within ±MaxPriority.
func ParsePriority(s string) (int, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for _, n := range priorityNames {
		if t == n.name {
			return n.p, nil
		}
	}
	p, err := strconv.Atoi(t)
	if err != nil || p < -MaxPriority || p > MaxPriority {
		return 0, fmt.Errorf("unknown priority %q (want interactive, standard, batch, sheddable, or an integer within ±%d)", s, MaxPriority)
	}
	return p, nil
}

// PriorityName is a priority's name, or its integer.
func PriorityName(p int) string {
	if name, ok := NamedPriority(p); ok {
		return name
	}
	return strconv.Itoa(p)
}

// NamedPriority is a priority's name, if it has one.
func NamedPriority(p int) (string, bool) {
	for _, n := range priorityNames {
		if p == n.p {
			return n.name, true
		}
	}
	return "", false
}
