// Package slab is a free-list arena: values of one type kept in a slice and
// addressed by int32 index, whose freed slots are reused before the slice
// grows. Linked structures built on it (LRU lists, per-key lists) hold
// indexes instead of pointers, so they cost the garbage collector nothing.
//
// A Slab is not safe for concurrent use. Its zero value is empty and ready.
package slab

// Slab holds values of type T.
type Slab[T any] struct {
	items []T
	free  []int32
}

// New stores v in a free slot (or a new one) and returns its index.
func (s *Slab[T]) New(v T) int32 {
	if n := len(s.free); n > 0 {
		i := s.free[n-1]
		s.free = s.free[:n-1]
		s.items[i] = v
		return i
	}
	s.items = append(s.items, v)
	return int32(len(s.items) - 1)
}

// Free gives slot i back; its value is zeroed and the slot may be reused by
// the next New. Freeing a slot twice corrupts the slab.
func (s *Slab[T]) Free(i int32) {
	var zero T
	s.items[i] = zero
	s.free = append(s.free, i)
}

// At returns a pointer to the value in slot i, valid until the next New.
func (s *Slab[T]) At(i int32) *T { return &s.items[i] }

// Len returns the number of slots in use.
func (s *Slab[T]) Len() int { return len(s.items) - len(s.free) }

// CopyFrom makes s an independent copy of src, reusing s's storage.
func (s *Slab[T]) CopyFrom(src *Slab[T]) {
	s.items = append(s.items[:0], src.items...)
	s.free = append(s.free[:0], src.free...)
}
