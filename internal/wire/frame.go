package wire

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// NextEvent finds the first whole server-sent event in buf: its lines
// through the blank line that ends it ("\n\n", "\r\n\r\n" or a mix).
// It returns the event's bytes (blank line included), what follows, and
// false when buf holds no whole event yet. Blank lines before an event's
// first field belong to the event (a relay passes them on untouched).
func NextEvent(buf []byte) (event, rest []byte, ok bool) {
	start := 0 // of the current line
	fields := false
	for {
		nl := bytes.IndexByte(buf[start:], '\n')
		if nl < 0 {
			return nil, buf, false
		}
		line := buf[start : start+nl]
		start += nl + 1
		if len(line) == 0 || (len(line) == 1 && line[0] == '\r') {
			if fields {
				return buf[:start], buf[start:], true
			}
			continue
		}
		fields = true
	}
}

// EventData returns the data of an event: its "data:" lines' values (one
// optional space after the colon removed) joined by "\n". A single data
// line, the usual case, is returned without copying; several are joined
// into scratch. It returns nil for an event without data.
func EventData(event []byte, scratch *[]byte) []byte {
	var one []byte
	n := 0
	for len(event) > 0 {
		line := event
		if i := bytes.IndexByte(event, '\n'); i >= 0 {
			line, event = event[:i], event[i+1:]
		} else {
			event = nil
		}
		line = bytes.TrimSuffix(line, []byte{'\r'})
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		v = bytes.TrimPrefix(v, []byte{' '})
		switch n {
		case 0:
			one = v
		case 1:
			*scratch = append(append(append((*scratch)[:0], one...), '\n'), v...)
		default:
			*scratch = append(append(*scratch, '\n'), v...)
		}
		n++
	}
	if n > 1 {
		return *scratch
	}
	return one
}

// IsDone reports whether an event's data is the [DONE] sentinel.
func IsDone(data []byte) bool { return string(bytes.TrimSpace(data)) == "[DONE]" }

// IsOpening reports whether an event's data is a Responses API stream's
// opening event (response.created, response.in_progress, response.queued),
// which engines send before the request is scheduled: no part of the
// answer yet.
func IsOpening(data []byte) bool {
	if len(data) == 0 || data[0] != '{' || !bytes.Contains(data, []byte(`"response.`)) {
		return false
	}
	switch gjson.GetBytes(data, "type").Str {
	case "response.created", "response.in_progress", "response.queued":
		return true
	}
	return false
}
