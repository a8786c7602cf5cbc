package trace

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"strings"
	"testing"
)

// errTooFar is returned by endless once a reader has consumed more than
// its limit: a reader that bounds its memory stops long before that.
var errTooFar = errors.New("reader consumed more than the limit")

// endless yields prefix, then fill forever (no newline), and errTooFar
// once more than limit bytes have been read.
type endless struct {
	prefix []byte
	fill   byte
	n      int
	limit  int
}

func (e *endless) Read(p []byte) (int, error) {
	if e.n > e.limit {
		return 0, errTooFar
	}
	k := 0
	for k < len(p) && len(e.prefix) > 0 {
		p[k] = e.prefix[0]
		e.prefix = e.prefix[1:]
		k++
	}
	for ; k < len(p); k++ {
		p[k] = e.fill
	}
	e.n += k
	return k, nil
}

// A line no trace can have (a JSON array on one line, a file with no
// newline, an unterminated CSV quote) must be refused without reading
// the whole of it into memory (2026-12-05: Read buffered the line whole, a
// 300 MB one-line JSON array cost 1.4 GB of RSS before its error).
func TestReadBoundsALine(t *testing.T) {
	const limit = 64 << 20
	for name, src := range map[string]*endless{
		"json array on one line": {prefix: []byte(`[{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}, `), fill: ' ', limit: limit},
		"no newline at all":      {fill: 0, limit: limit},
		"unterminated CSV quote": {prefix: []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n\"2023-11-16 18:15:46,1,1"), fill: 'x', limit: limit},
	} {
		_, err := Read(src, "big", FormatAuto)
		if err == nil || errors.Is(err, errTooFar) {
			t.Errorf("%s: Read consumed more than %d MiB of one line (err %v); want a bounded refusal", name, limit>>20, err)
		}
	}
}

// A UTF-8 byte order mark before a JSON Lines trace is skipped, as before a
// CSV header (2026-12-05: refused as "invalid character 'ï'").
func TestReadJSONLWithBOM(t *testing.T) {
	line := `{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}`
	for _, f := range []Format{FormatAuto, FormatMooncake} {
		reqs, err := Read(strings.NewReader("\ufeff"+line+"\r\n"), "bom.jsonl", f)
		if err != nil {
			t.Errorf("format %s: %v", f, err)
			continue
		}
		if len(reqs) != 1 || reqs[0].InputTokens != 6955 {
			t.Errorf("format %s: got %+v", f, reqs)
		}
	}
}

// Under auto detection, a first line that is neither JSON nor a known CSV
// header is reported as such (and a gzip file as one), not as broken JSON
// (2026-12-05: "invalid character '\x1f' looking for beginning of value").
func TestReadUnknownFormat(t *testing.T) {
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	io.WriteString(w, `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}`+"\n")
	w.Close()
	for name, in := range map[string]string{
		"gzip":                gz.String(),
		"burstgpt 8 columns":  "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,1,2.3,GPT-4,100,50,150,Conversation log\n",
		"azure multimodal":    "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n2025-01-01 00:00:00,1,900,120\n",
		"pandas index column": ",TIMESTAMP,ContextTokens,GeneratedTokens\n0,2023-11-16 18:15:46.6805900,374,44\n",
		"semicolon-separated": "TIMESTAMP;ContextTokens;GeneratedTokens\n2023-11-16 18:15:46.6805900;374;44\n",
	} {
		_, err := Read(strings.NewReader(in), "t", FormatAuto)
		if err == nil {
			t.Errorf("%s: read without error", name)
			continue
		}
		if strings.Contains(err.Error(), "invalid JSON") {
			t.Errorf("%s: misleading error %q; want one saying the first line is no known trace format (and gzip for gzip)", name, err)
		}
	}
}

// An unterminated quote is reported at the line where the CSV reader gave
// up (the end of the file), not where the bad row starts.
func TestReadCSVQuoteErrorLine(t *testing.T) {
	in := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"\"2023-11-16 18:15:46,1,1\n" + // line 2: the quote is never closed
		strings.Repeat("2023-11-16 18:15:47,1,1\n", 50)
	_, err := Read(strings.NewReader(in), "q.csv", FormatAuto)
	var le *LineError
	if !errors.As(err, &le) || le.Line != 2 {
		t.Errorf("error %v; want it at q.csv:2, where the unterminated quote is", err)
	}
}

// A trace's requests are bounded in number and in prompt length, in JSON
// Lines as in CSV (a user's test, 2026-12-07: an endless stream of lines
// ran out of memory with a stack dump; one line of 102,400,000 prompt
// tokens made a replayer build a 400 MB prompt).
func TestTraceRequestsAreBounded(t *testing.T) {
	defer func(n int) { readLimit = n }(readLimit)
	readLimit = 3
	line := `{"timestamp":0,"input_length":100,"output_length":10,"hash_ids":[0]}` + "\n"
	if _, err := Read(strings.NewReader(strings.Repeat(line, 3)), "t", FormatAuto); err != nil {
		t.Errorf("3 requests, the limit: %v", err)
	}
	_, err := Read(strings.NewReader(strings.Repeat(line, 4)), "t", FormatAuto)
	if err == nil || !strings.Contains(err.Error(), "t:4: more than") {
		t.Errorf("4 requests past a limit of 3: %v", err)
	}
	csv := "TIMESTAMP,ContextTokens,GeneratedTokens\n" + strings.Repeat("2023-11-16 18:15:46.6805900,100,10\n", 4)
	if _, err := Read(strings.NewReader(csv), "c", FormatAuto); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("a CSV of 4 requests past a limit of 3: %v", err)
	}
	huge := `{"timestamp":0,"input_length":16777217,"output_length":1,"hash_ids":[0]}` + "\n"
	if _, err := Read(strings.NewReader(huge), "h", FormatAuto); err == nil || !strings.Contains(err.Error(), "input_length 16777217 is more than the limit") {
		t.Errorf("a prompt past MaxTokens: %v", err)
	}
}
