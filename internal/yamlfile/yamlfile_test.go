package yamlfile

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type replica struct {
	ID     string  `yaml:"id"`
	Weight float64 `yaml:"weight"`
}

type doc struct {
	Replicas []replica         `yaml:"replicas"`
	Every    time.Duration     `yaml:"every"`
	Tune     *bool             `yaml:"tune"`
	Count    int               `yaml:"count"`
	Weights  map[string]uint64 `yaml:"weights"`
	Name     string            `yaml:"name"`
}

// What is wrong with a file is said on one line, by line and field, in the
// file's terms: not yaml.v3's heading and Go's type names.
func TestErrorsAreOneLineInTheFilesTerms(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"replicas:\n  - id: a\n    zone: x\n", "line 3: unknown field zone"},
		{"every: soon\n", "line 1: `soon` is not a duration (e.g. 30s)"},
		{"tune: maybe\n", "line 1: `maybe` is not true or false"},
		{"count: [1]\n", "line 1: a list is not an integer"},
		{"count: {a: 1}\n", "line 1: a mapping is not an integer"},
		{"replicas: 3\n", "line 1: `3` is not a list"},
		{"weights: 3\n", "line 1: `3` is not a mapping"},
		{"weights: {a: -1}\n", "line 1: `-1` is not a non-negative integer"},
		{"name: [a]\n", "line 1: a list is not a string"},
		{"replicas:\n  - weight: heavy\n", "line 2: `heavy` is not a number"},
		{"every: x\ncount: y\n", "line 1: `x` is not a duration (e.g. 30s); line 2: `y` is not an integer"},
		{"count: [\n", "yaml: line 1: did not find expected node content"},
	} {
		var d doc
		if err := Decode([]byte(c.in), &d); err == nil || err.Error() != c.want {
			t.Errorf("%q: %v, want %q", c.in, err, c.want)
		}
	}
	var d doc
	if err := Decode(nil, &d); err != io.EOF {
		t.Errorf("an empty document: %v, want io.EOF", err)
	}
	if err := Decode([]byte("replicas: [{id: a, weight: 2}]\nevery: 30s\ntune: true\n"), &d); err != nil || d.Replicas[0].Weight != 2 || d.Every != 30*time.Second || !*d.Tune {
		t.Errorf("%+v, %v", d, err)
	}
}

// A second document is refused, not ignored.
func TestOneDocument(t *testing.T) {
	var d doc
	if err := Decode([]byte("count: 1\n---\ncount: 2\n"), &d); err == nil || err.Error() != "line 2: a second document: a file holds one" {
		t.Errorf("%v", err)
	}
	for _, in := range []string{"count: 1\n---\n", "count: 1\n---\n~\n", "count: 1\n---\n# nothing\n---\n"} {
		if err := Decode([]byte(in), &d); err != nil {
			t.Errorf("%q: empty later documents: %v", in, err)
		}
	}
	// A third is refused as a second is (a review: an empty second one hid it).
	for _, in := range []string{"count: 1\n---\n---\ncount: 2\n", "count: 1\n---\n# nothing\n---\ncount: 2\n"} {
		if err := Decode([]byte(in), &d); err == nil || !strings.Contains(err.Error(), "a second document") {
			t.Errorf("%q: %v", in, err)
		}
	}
	// A later document's syntax error is said as such.
	if err := Decode([]byte("count: 1\n---\ncount: [\n"), &d); err == nil || !strings.Contains(err.Error(), "did not find expected node content") {
		t.Errorf("a syntax error in the second document: %v", err)
	}
}

// A file past MaxFileBytes is refused in bounded memory, on one line (a
// user's test, 2026-12-07: a config, a topology or weights named
// /dev/zero grew until the runtime died with a stack dump).
func TestReadFileIsBounded(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, MaxFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{big, "/dev/zero"} {
		if path == "/dev/zero" {
			if _, err := os.Stat(path); err != nil {
				t.Logf("skipping %s: %v", path, err)
				continue
			}
		}
		_, err := ReadFile(path)
		if err == nil || !strings.Contains(err.Error(), "larger than 16 MiB") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v", path, err)
		}
	}
	ok := filepath.Join(t.TempDir(), "ok.yaml")
	if err := os.WriteFile(ok, []byte("a: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if data, err := ReadFile(ok); err != nil || string(data) != "a: 1\n" {
		t.Errorf("a small file: %q, %v", data, err)
	}
}
