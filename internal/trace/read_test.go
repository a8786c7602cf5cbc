package trace

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// mooncakePath is the real Mooncake trace, present on developer machines
// and in CI beside the repository (../shared/data), never in it.
const mooncakePath = "../../../shared/data/traces/mooncake_conversation_trace.jsonl"

// readMooncake reads the real Mooncake trace or skips the test.
func readMooncake(tb testing.TB) []Request {
	tb.Helper()
	if _, err := os.Stat(mooncakePath); err != nil {
		tb.Skipf("Mooncake trace not available (%v); it lives in ../shared/data beside the repository", err)
	}
	reqs, err := ReadFile(mooncakePath, FormatAuto)
	if err != nil {
		tb.Fatal(err)
	}
	return reqs
}

func TestParseFormat(t *testing.T) {
	tests := []struct {
		in      string
		want    Format
		wantErr string
	}{
		{"", FormatAuto, ""},
		{"auto", FormatAuto, ""},
		{"Mooncake", FormatMooncake, ""},
		{" gorgo ", FormatGorgo, ""},
		{"Azure", FormatAzure, ""},
		{"burstgpt", FormatBurstGPT, ""},
		{"csv", "", `unknown trace format "csv" (valid: auto, mooncake, gorgo, azure, burstgpt)`},
	}
	for _, tt := range tests {
		got, err := ParseFormat(tt.in)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("ParseFormat(%q) error = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseFormat(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestReadMooncake(t *testing.T) {
	const in = `{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [0, 1]}

{"timestamp": 1.5, "input_length": 1100, "output_length": 0, "hash_ids": [0, 1, 2], "extra": {"ignored": [1, 2]}}` + "\r\n" +
		`{"timestamp": 2000, "input_length": 512, "output_length": 7, "hash_ids": [0], "session_id": "ignored in mooncake format"}
`
	got, err := Read(strings.NewReader(in), "m.jsonl", FormatMooncake)
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{Time: 0, Session: "s1", Turn: 1, InputTokens: 600, OutputTokens: 10, HashIDs: []uint64{0, 1}},
		{Time: 1500 * time.Microsecond, Session: "s1", Turn: 2, InputTokens: 1100, OutputTokens: 0, HashIDs: []uint64{0, 1, 2}},
		{Time: 2 * time.Second, Session: "s1", Turn: 3, InputTokens: 512, OutputTokens: 7, HashIDs: []uint64{0}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Read =\n%+v\nwant\n%+v", got, want)
	}
}

func TestReadGorgo(t *testing.T) {
	const in = `{"timestamp": 0.000001, "session_id": "a", "turn": 3, "user_id": "alice", "input_length": 10, "output_length": 5, "hash_ids": [7], "messages": [{"role": "user", "content": "hi \"there\""}]}
{"timestamp": 12.25, "session_id": "b", "input_length": 513, "output_length": 1, "hash_ids": [8, 9], "messages": []}
`
	for _, f := range []Format{FormatGorgo, FormatAuto, ""} {
		got, err := Read(strings.NewReader(in), "g.jsonl", f)
		if err != nil {
			t.Fatalf("format %q: %v", f, err)
		}
		want := []Request{
			{Time: time.Nanosecond, Session: "a", Turn: 3, User: "alice", InputTokens: 10, OutputTokens: 5,
				HashIDs: []uint64{7}, Messages: []Message{{Role: "user", Content: `hi "there"`}}},
			{Time: 12250 * time.Microsecond, Session: "b", InputTokens: 513, OutputTokens: 1, HashIDs: []uint64{8, 9}},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("format %q: Read =\n%+v\nwant\n%+v", f, got, want)
		}
	}
}

func TestReadAutoDetect(t *testing.T) {
	tests := []struct {
		name, in    string
		wantSession string
	}{
		{"gorgo", "\n\n" + `{"timestamp": 0, "session_id": "x", "input_length": 1, "output_length": 1, "hash_ids": [1]}`, "x"},
		{"mooncake", "  \n" + `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, "s1"},
	}
	for _, tt := range tests {
		got, err := Read(strings.NewReader(tt.in), tt.name, FormatAuto)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if len(got) != 1 || got[0].Session != tt.wantSession {
			t.Errorf("%s: Read = %+v, want one request of session %q", tt.name, got, tt.wantSession)
		}
	}
	got, err := Read(strings.NewReader("\n \n"), "empty", FormatAuto)
	if err != nil || len(got) != 0 {
		t.Errorf("empty trace: Read = %v, %v; want no requests", got, err)
	}
}

func TestReadErrors(t *testing.T) {
	const ok = `{"timestamp": 5, "input_length": 100, "output_length": 1, "hash_ids": [1]}` + "\n"
	tests := []struct {
		name string
		f    Format
		in   string
		want string
	}{
		{"invalid JSON", FormatAuto, ok + `{"timestamp": 6,` + "\n",
			"t.jsonl:2: invalid JSON: unexpected end of JSON input"},
		{"not an object", FormatMooncake, ok + "\n[1]\n",
			"t.jsonl:3: invalid JSON: a line must be an object, got a list"},
		{"zero input", FormatAuto, ok + `{"timestamp": 6, "input_length": 0, "output_length": 1, "hash_ids": []}`,
			"t.jsonl:2: input_length must be positive, got 0"},
		{"negative input", FormatAuto, `{"timestamp": 6, "input_length": -3, "output_length": 1, "hash_ids": []}`,
			"t.jsonl:1: input_length must be positive, got -3"},
		{"hash count", FormatAuto, ok + `{"timestamp": 6, "input_length": 4000, "output_length": 1, "hash_ids": [1, 2, 3]}`,
			"t.jsonl:2: len(hash_ids)=3 does not match input_length 4000 (want ceil(4000/512)=8)"},
		{"negative output", FormatAuto, `{"timestamp": 6, "input_length": 1, "output_length": -1, "hash_ids": [1]}`,
			"t.jsonl:1: output_length must be non-negative, got -1"},
		{"huge output", FormatAuto, `{"timestamp": 6, "input_length": 1, "output_length": 9223372036854775807, "hash_ids": [1]}`,
			"t.jsonl:1: output_length 9223372036854775807 is more than the limit of 16777216"},
		{"backwards", FormatAuto, ok + ok + `{"timestamp": 4.5, "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:3: timestamp 4.5 ms is before the previous line's 5 ms (traces must be time-ordered)"},
		{"negative timestamp", FormatAuto, `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: timestamp must be non-negative, got -1"},
		{"huge timestamp", FormatAuto, `{"timestamp": 1e300, "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: timestamp 1e300 ms out of range"},
		{"missing timestamp", FormatAuto, `{"input_length": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: missing timestamp"},
		{"missing input", FormatAuto, `{"timestamp": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: missing input_length"},
		{"missing output", FormatAuto, `{"timestamp": 1, "input_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: missing output_length"},
		{"missing hash_ids", FormatAuto, `{"timestamp": 1, "input_length": 1, "output_length": 1}`,
			"t.jsonl:1: missing hash_ids"},
		{"negative hash id", FormatAuto, `{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [-1]}`,
			"t.jsonl:1: hash_ids: -1 is not a non-negative integer"},
		{"string input", FormatAuto, `{"timestamp": 1, "input_length": "1", "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: input_length: a string is not an integer"},
		{"string timestamp", FormatAuto, `{"timestamp": "5000", "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: timestamp: a string is not a number"},
		{"bool timestamp", FormatAuto, `{"timestamp": true, "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: timestamp: true or false is not a number"},
		{"null timestamp", FormatAuto, `{"timestamp": null, "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: missing timestamp"},
		{"a message not an object", FormatAuto, `{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1], "messages": [5]}`,
			"t.jsonl:1: messages: a number is not an object"},
		{"gorgo without session", FormatGorgo, `{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: missing session_id (required in gorgo format)"},
		{"auto gorgo, later line without session", FormatAuto,
			`{"timestamp": 1, "session_id": "a", "input_length": 1, "output_length": 1, "hash_ids": [1]}` + "\n" + ok,
			"t.jsonl:2: missing session_id (required in gorgo format)"},
		{"empty session", FormatGorgo, `{"timestamp": 1, "session_id": "", "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: missing session_id (required in gorgo format)"},
		{"turn zero", FormatGorgo, `{"timestamp": 1, "session_id": "a", "turn": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
			"t.jsonl:1: turn must be at least 1, got 0"},
		{"bad format", Format("csv"), ok, `unknown trace format "csv" (valid: auto, mooncake, gorgo, azure, burstgpt)`},
	}
	for _, tt := range tests {
		_, err := Read(strings.NewReader(tt.in), "t.jsonl", tt.f)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: error = %v\nwant %s", tt.name, err, tt.want)
		}
	}
}

func TestReadLineErrorType(t *testing.T) {
	_, err := Read(strings.NewReader("{}\n"), "x.jsonl", FormatAuto)
	var le *LineError
	if !errors.As(err, &le) || le.Name != "x.jsonl" || le.Line != 1 {
		t.Fatalf("error %v is not a LineError for x.jsonl:1", err)
	}
	_, err = ReadFile("testdata/does-not-exist.jsonl", FormatAuto)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ReadFile of a missing file: error %v does not wrap os.ErrNotExist", err)
	}
}

// TestReadLongLines checks lines far longer than the reader's buffer, and
// that line numbers stay right after them.
func TestReadLongLines(t *testing.T) {
	const n = 30000 // hash ids per line (prompts under MaxTokens): ~190 KB lines
	var b bytes.Buffer
	for line := range 3 {
		b.WriteString(`{"timestamp": ` + strconv.Itoa(line) + `, "input_length": ` + strconv.Itoa(n*BlockTokens) + `, "output_length": 1, "hash_ids": [`)
		for j := range n {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString(strconv.Itoa(line*n + j))
		}
		b.WriteString("]}\n")
	}
	long := b.String()
	got, err := Read(strings.NewReader(long), "long.jsonl", FormatMooncake)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || len(got[2].HashIDs) != n || got[2].HashIDs[n-1] != 3*n-1 {
		t.Fatalf("long lines read wrongly: %d requests", len(got))
	}
	_, err = Read(strings.NewReader(long+"\n"+`{"timestamp": 9}`), "long.jsonl", FormatMooncake)
	if want := "long.jsonl:5: missing input_length"; err == nil || err.Error() != want {
		t.Errorf("error after long lines = %v, want %s", err, want)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	reqs, err := Generate(GenConfig{Preset: "chat", Seed: 3, Duration: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	reqs[0].Messages = []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "<b>ünïcode</b> \u2028 \"q\"\n"}}
	reqs[1].Time = reqs[0].Time + 1234567 // sub-millisecond offset
	var b bytes.Buffer
	if err := Write(&b, reqs); err != nil {
		t.Fatal(err)
	}
	got, err := Read(&b, "rt.jsonl", FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, reqs) {
		t.Fatalf("round trip changed the requests")
	}
}

func TestWriteFormat(t *testing.T) {
	reqs := []Request{
		{Time: 1500 * time.Microsecond, Session: "s1", Turn: 2, User: "u", InputTokens: 3, OutputTokens: 0, HashIDs: []uint64{42},
			Messages: []Message{{Role: "user", Content: "<hi>"}}},
		{Time: 2 * time.Second, Session: "s2", InputTokens: 513, OutputTokens: 9, HashIDs: []uint64{1, 2}},
	}
	var b bytes.Buffer
	if err := Write(&b, reqs); err != nil {
		t.Fatal(err)
	}
	want := `{"timestamp":1.5,"session_id":"s1","turn":2,"user_id":"u","input_length":3,"output_length":0,"hash_ids":[42],"messages":[{"role":"user","content":"<hi>"}]}
{"timestamp":2000,"session_id":"s2","input_length":513,"output_length":9,"hash_ids":[1,2]}
`
	if b.String() != want {
		t.Errorf("Write =\n%s\nwant\n%s", b.String(), want)
	}
}

func TestWriteErrors(t *testing.T) {
	good := Request{Session: "s", InputTokens: 1, HashIDs: []uint64{1}}
	noSession := good
	noSession.Session = ""
	badIDs := good
	badIDs.InputTokens = 600
	late := good
	late.Time = time.Second
	tests := []struct {
		name string
		reqs []Request
		want string
	}{
		{"no session", []Request{good, noSession},
			"writing request 2: empty session (gorgo format requires session_id; derive sessions first)"},
		{"bad ids", []Request{badIDs},
			"writing request 1: len(hash_ids)=1 does not match input_length 600 (want ceil(600/512)=2)"},
		{"backwards", []Request{late, good},
			"writing request 2: time 0s before the previous request's 1s"},
	}
	for _, tt := range tests {
		err := Write(&bytes.Buffer{}, tt.reqs)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: error = %v, want %s", tt.name, err, tt.want)
		}
	}
}

func TestParseMillis(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"0", 0},
		{"17", 17 * time.Millisecond},
		{"1.5", 1500 * time.Microsecond},
		{"3537999.000001", 3537999*time.Millisecond + 1},
		{"2.0000004", 2000000}, // more than 6 decimals: rounded to the ns
		{"1e3", time.Second},
		{"0.25e1", 2500 * time.Microsecond},
	}
	for _, tt := range tests {
		got, err := parseMillis(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("parseMillis(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestFormatMillis(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{0, "0"},
		{17 * time.Millisecond, "17"},
		{1500 * time.Microsecond, "1.5"},
		{3537999*time.Millisecond + 1, "3537999.000001"},
		{999999, "0.999999"},
	}
	for _, tt := range tests {
		if got := formatMillis(tt.in); got != tt.want {
			t.Errorf("formatMillis(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func BenchmarkReadMooncake(b *testing.B) {
	if _, err := os.Stat(mooncakePath); err != nil {
		b.Skipf("Mooncake trace not available: %v", err)
	}
	data, err := os.ReadFile(mooncakePath)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Read(bytes.NewReader(data), "mooncake", FormatAuto); err != nil {
			b.Fatal(err)
		}
	}
}
