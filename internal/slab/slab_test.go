package slab

import "testing"

func TestSlabReusesFreedSlots(t *testing.T) {
	var s Slab[string]
	a, b, c := s.New("a"), s.New("b"), s.New("c")
	if a != 0 || b != 1 || c != 2 || s.Len() != 3 {
		t.Fatalf("indexes %d %d %d, len %d", a, b, c, s.Len())
	}
	s.Free(b)
	if *s.At(b) != "" || s.Len() != 2 {
		t.Fatalf("freed slot holds %q, len %d", *s.At(b), s.Len())
	}
	if d := s.New("d"); d != b || *s.At(d) != "d" {
		t.Fatalf("new slot %d (%q), want the freed %d", d, *s.At(d), b)
	}
	if e := s.New("e"); e != 3 {
		t.Fatalf("slot %d, want a fresh 3", e)
	}
	var cp Slab[string]
	cp.CopyFrom(&s)
	*cp.At(a) = "changed"
	cp.Free(c)
	if *s.At(a) != "a" || s.Len() != 4 || cp.Len() != 3 {
		t.Fatalf("copy is not independent: %q, lens %d %d", *s.At(a), s.Len(), cp.Len())
	}
}
