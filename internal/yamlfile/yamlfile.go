// Package yamlfile decodes the YAML files a user writes (gorgo serve's
// config, a topology) strictly, every field known, and says what is wrong
// with one in the file's terms, on one line.
package yamlfile

import (
	"bytes"
	"errors"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// Decode decodes the first document of data into v, a field v does not
// have an error (yaml.v3's inline maps still take what their struct does
// not); io.EOF for a document that is empty; other errors one line (see
// Error).
func Decode(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return Error(err)
	}
	return nil
}

// Error makes yaml.v3's type errors one line in the config's terms:
// "line 4: unknown field weight", "line 1: `abc` is not a duration (e.g.
// 30s)", where yaml.v3 writes one line per error after a heading, naming
// Go's types ("field weight not found in type fleet.ReplicaConfig").
func Error(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err // a syntax error: one line already
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if g := notFound.FindStringSubmatch(m); g != nil {
			m = g[1] + "unknown field " + g[2]
		} else if g := cannot.FindStringSubmatch(m); g != nil {
			what := strings.TrimSpace(g[3])
			if what == "" {
				what = "a " + map[string]string{"seq": "list", "map": "mapping"}[g[2]]
				if what == "a " {
					what = "this value"
				}
			}
			m = g[1] + what + " is not " + kind(g[4])
		}
		msgs[i] = m
	}
	return errors.New(strings.Join(msgs, "; "))
}

var (
	notFound = regexp.MustCompile(`^(line \d+: )field (\S+) not found in type \S+$`)
	cannot   = regexp.MustCompile("^(line \\d+: )cannot unmarshal !!(\\w+)( `[^`]*`)? into (\\S+)$")
)

// kind names what a Go type reads, as a config's reader knows it.
func kind(goType string) string {
	switch {
	case goType == "time.Duration":
		return "a duration (e.g. 30s)"
	case goType == "bool" || goType == "*bool":
		return "true or false"
	case strings.HasPrefix(goType, "uint"):
		return "a non-negative integer"
	case strings.HasPrefix(goType, "int"):
		return "an integer"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	default:
		return "a mapping" // a struct or a map
	}
}
