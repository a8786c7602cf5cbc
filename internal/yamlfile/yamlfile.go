// Package yamlfile decodes the YAML files a user writes (gorgo serve's
// config, a topology) strictly, every field known, and says what is wrong
// with one in the file's terms, on one line; and reads such a file (or
// another a user writes: weights, a round-trip matrix, a key) in bounded
// memory.
package yamlfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// MaxFileBytes bounds a file a user writes (ReadFile): far more than any
// config, topology or matrix needs, far less than a mistaken path
// (/dev/zero, a trace, a disk image) would make the reader hold.
const MaxFileBytes = 16 << 20

// ReadFile reads the file a user wrote at path, refusing one larger than
// MaxFileBytes with an error of one line rather than reading it all.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d MiB: not a file of this kind", path, MaxFileBytes>>20)
	}
	return data, nil
}

// Decode decodes the first document of data into v, a field v does not
// have an error (yaml.v3's inline maps still take what their struct does
// not); io.EOF for a document that is empty; other errors one line (see
// Error).
func Decode(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return Error(err, v)
	}
	// Any later document would be ignored (an edit pasted after "---"):
	// each must be empty.
	for {
		var next yaml.Node
		switch err := dec.Decode(&next); {
		case err == io.EOF:
			return nil
		case err != nil:
			return Error(err, nil)
		case !empty(&next):
			return fmt.Errorf("line %d: a second document: a file holds one", next.Line)
		}
	}
}

// empty reports whether a document holds nothing ("---" and no more).
func empty(n *yaml.Node) bool {
	return len(n.Content) == 0 || len(n.Content) == 1 && n.Content[0].Tag == "!!null"
}

// Error makes yaml.v3's type errors one line in the file's terms: "line 4:
// unknown field weight", "line 1: `abc` is not a duration (e.g. 30s)",
// where yaml.v3 writes one line per error after a heading, naming Go's
// types ("field weight not found in type fleet.ReplicaConfig"). v is what
// was decoded into: its types say what each named type takes (nil: their
// names alone).
func Error(err error, v any) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err // a syntax error: one line already
	}
	types := map[string]reflect.Type{}
	if v != nil {
		collect(reflect.TypeOf(v), types)
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		m = strings.ReplaceAll(m, "\n", " ") // a block scalar's value
		if g := notFound.FindStringSubmatch(m); g != nil {
			m = g[1] + "unknown field " + g[2]
		} else if g := cannot.FindStringSubmatch(m); g != nil {
			what := strings.TrimSpace(g[3])
			if what == "" {
				what = map[string]string{"seq": "a list", "map": "a mapping"}[g[2]]
				if what == "" {
					what = "this value"
				}
			}
			m = g[1] + what + " is not " + kind(g[4], types)
		}
		msgs[i] = m
	}
	return errors.New(strings.Join(msgs, "; "))
}

var (
	notFound = regexp.MustCompile(`^(line \d+: )field (\S+) not found in type \S+$`)
	cannot   = regexp.MustCompile("^(line \\d+: )cannot unmarshal !!(\\w+)( `.*`)? into (\\S+)$")
)

// collect records every type reachable from t by its name, as yaml.v3
// names it in an error (reflect.Type.String).
func collect(t reflect.Type, seen map[string]reflect.Type) {
	if t == nil {
		return
	}
	if _, ok := seen[t.String()]; ok {
		return
	}
	seen[t.String()] = t
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		collect(t.Elem(), seen)
	case reflect.Map:
		collect(t.Key(), seen)
		collect(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() {
				collect(f.Type, seen)
			}
		}
	}
}

// kind names what a Go type reads, as a file's reader knows it: by its
// kind where types has it, else by its name.
func kind(goType string, types map[string]reflect.Type) string {
	if goType == "time.Duration" {
		return "a duration (e.g. 30s)"
	}
	t, ok := types[goType]
	for ok && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if !ok {
		switch {
		case strings.HasPrefix(goType, "[]"):
			return "a list"
		case strings.HasPrefix(goType, "map["):
			return "a mapping"
		}
		return "a " + goType[strings.LastIndex(goType, ".")+1:]
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	default:
		return "a mapping" // a struct or a map
	}
}
