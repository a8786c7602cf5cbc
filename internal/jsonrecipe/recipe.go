// Package jsonrecipe turns fuzz data into valid JSON objects made of given
// keys and scalars (in their tricky spellings: case variants, escapes,
// duplicates, numbers that overflow), so that fuzzers of JSON readers
// spend their time on what the readers look at, not on syntax errors. It
// is for tests.
package jsonrecipe

// Recipe reads its choices from Data, one byte at a time (0 once spent).
type Recipe struct {
	Data []byte
	// Keys are the object member names to draw from (JSON string
	// literals, quotes included), Scalars the values (JSON literals).
	Keys, Scalars []string
	// MaxDepth bounds the nesting (default 4); MaxItems the members of an
	// object (default 4) and the elements of an array (default 3).
	MaxDepth, MaxItems int
}

func (r *Recipe) next() int {
	if len(r.Data) == 0 {
		return 0
	}
	b := r.Data[0]
	r.Data = r.Data[1:]
	return int(b)
}

// Object appends a JSON object to dst.
func (r *Recipe) Object(dst []byte) []byte { return r.object(dst, 0) }

func (r *Recipe) limits() (depth, items int) {
	depth, items = r.MaxDepth, r.MaxItems
	if depth <= 0 {
		depth = 4
	}
	if items <= 0 {
		items = 4
	}
	return depth, items
}

func (r *Recipe) value(dst []byte, depth int) []byte {
	maxDepth, items := r.limits()
	switch c := r.next(); {
	case depth < maxDepth && c%8 == 0:
		return r.object(dst, depth+1)
	case depth < maxDepth && c%8 == 1:
		dst = append(dst, '[')
		for i := range r.next() % items {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = r.value(dst, depth+1)
		}
		return append(dst, ']')
	default:
		return append(dst, r.Scalars[(c/8)%len(r.Scalars)]...)
	}
}

func (r *Recipe) object(dst []byte, depth int) []byte {
	_, items := r.limits()
	dst = append(dst, '{')
	for i := range r.next() % (items + 1) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, r.Keys[r.next()%len(r.Keys)]...)
		dst = append(dst, ':')
		dst = r.value(dst, depth)
	}
	return append(dst, '}')
}
