package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
)

// LineError reports a problem with one line of a trace file. Its message is
// "NAME:LINE: problem", the form compilers use, so editors can jump to it.
type LineError struct {
	// Name is the file name (or the name given to Read).
	Name string
	// Line is the 1-based line number.
	Line int
	// Err is the problem.
	Err error
}

func (e *LineError) Error() string { return fmt.Sprintf("%s:%d: %v", e.Name, e.Line, e.Err) }

// Unwrap returns the underlying problem.
func (e *LineError) Unwrap() error { return e.Err }

// ReadFile reads the trace at path in format f (see Read); errors name the
// path and the line.
func ReadFile(path string, f Format) ([]Request, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading trace: %w", err)
	}
	defer file.Close()
	return Read(file, path, f)
}

// maxLineBytes bounds a trace's line: a request's is at most a few hundred
// kilobytes (its hash ids).
const maxLineBytes = 32 << 20

// Read reads a trace in format f: JSON Lines (FormatMooncake, FormatGorgo)
// or CSV (FormatAzure, FormatBurstGPT); FormatAuto or "" detects it from the
// first non-empty line. name labels errors, which have the form
// "name:line: problem" (see LineError). Blank lines are skipped, lines may
// be as long as maxLineBytes, and the requests at most MaxGenerated.
// Timestamps must be non-decreasing: traces are time-ordered and a line
// that goes back in time is an error. Requests of a
// Mooncake trace get sessions and turns from DeriveSessions; those of a CSV
// trace get one session each and blocks of their own (see FormatAzure). The
// requests' HashIDs are cut from shared arrays with capacity equal to
// length, so appending to one copies it. A file with no requests (empty, or
// a CSV header alone) gives none and no error. A line longer than
// maxLineBytes (a JSON array on one line, a binary file, an unterminated
// CSV quote) is refused as soon as it is read that far.
func Read(r io.Reader, name string, f Format) ([]Request, error) {
	f, err := ParseFormat(string(f))
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		reqs   []Request
		ids    idArena
		long   []byte
		lineNo int
		prev   Request
		first  = true
	)
	for {
		line, rerr := br.ReadSlice('\n')
		if rerr == bufio.ErrBufferFull {
			long = append(long, line...)
			if len(long) > maxLineBytes {
				return nil, &LineError{name, lineNo + 1, fmt.Errorf("line longer than %d MiB: not a JSON Lines trace (a JSON array, or a compressed or binary file?)", maxLineBytes>>20)}
			}
			continue
		}
		if rerr != nil && rerr != io.EOF {
			return nil, fmt.Errorf("reading %s: %w", name, rerr)
		}
		if len(long) > 0 {
			long = append(long, line...)
			line = long
		}
		if len(line) > 0 {
			lineNo++
			line = bytes.TrimSpace(line)
		}
		if len(line) > 0 && first {
			first = false
			line = bytes.TrimPrefix(line, []byte("\ufeff")) // a byte order mark
			cf, err := csvStart(line, f)
			if err != nil {
				return nil, &LineError{name, lineNo, err}
			}
			if cf != "" {
				return readCSV(br, name, cf, lineNo)
			}
		}
		if len(line) > 0 {
			var rec record
			if err := json.Unmarshal(line, &rec); err != nil {
				return nil, &LineError{name, lineNo, jsonError(err)}
			}
			if f == FormatAuto {
				f = FormatMooncake
				if rec.SessionID != nil {
					f = FormatGorgo
				}
			}
			req, err := rec.request(f)
			if err != nil {
				return nil, &LineError{name, lineNo, err}
			}
			if len(reqs) > 0 && req.Time < prev.Time {
				return nil, &LineError{name, lineNo, fmt.Errorf(
					"timestamp %s ms is before the previous line's %s ms (traces must be time-ordered)",
					formatMillis(req.Time), formatMillis(prev.Time))}
			}
			if len(reqs) >= readLimit {
				return nil, &LineError{name, lineNo, errTooMany}
			}
			req.HashIDs = ids.copy(req.HashIDs)
			reqs = append(reqs, req)
			prev = req
		}
		long = long[:0]
		if rerr == io.EOF {
			break
		}
	}
	if f == FormatMooncake {
		DeriveSessions(reqs)
	}
	return reqs, nil
}

// errTooMany is a trace past MaxGenerated requests: more than gorgo
// simulates, and more than it holds (a stream that never ends, a file
// that is not one trace).
var errTooMany = fmt.Errorf("more than %d requests: more than gorgo simulates or replays at once (cut the trace into windows)", int(MaxGenerated))

// readLimit is MaxGenerated, as Read applies it (a test's to lower).
var readLimit = int(MaxGenerated)

// jsonError says what is wrong with a line encoding/json could not read,
// in the trace's terms: a field's value of the wrong kind by the field's
// name ("hash_ids: -1 is not a non-negative integer"), not Go's struct and
// types ("cannot unmarshal number -1 into Go struct field record.hash_ids
// of type uint64").
func jsonError(err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	got, ok := strings.CutPrefix(te.Value, "number ")
	if !ok {
		got = map[string]string{"string": "a string", "array": "a list", "object": "an object", "bool": "true or false", "number": "a number"}[te.Value]
		if got == "" {
			got = te.Value
		}
	}
	if te.Field == "" {
		return fmt.Errorf("invalid JSON: a line must be an object, got %s", got)
	}
	want := "a number"
	switch te.Type.Kind() {
	case reflect.Struct, reflect.Map:
		want = "an object"
	case reflect.Int, reflect.Int64, reflect.Int32:
		want = "an integer"
	case reflect.Uint, reflect.Uint64, reflect.Uint32:
		want = "a non-negative integer"
	case reflect.String:
		want = "a string"
	case reflect.Slice:
		want = "a list"
	case reflect.Bool:
		want = "true or false"
	}
	return fmt.Errorf("%s: %s is not %s", te.Field, got, want)
}
