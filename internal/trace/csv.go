package trace

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Column names of the CSV formats, in file order. Headers match them
// case-insensitively, with spaces around each name ignored.
var (
	azureHeader    = []string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
	burstGPTHeader = []string{"Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"}
)

// MaxTokens bounds a request's input and output lengths in a trace (the simulator
// and the emulators would run one of 2^63 tokens for ever), and a CSV
// row's prompt length (the reader makes its block ids: a huge count would
// allocate without bound). No model's context is near it.
const MaxTokens = 1 << 24

// maxTraceTime is the latest request time a trace may have (about 146
// years): what fits a Duration with room to spare, as maxTimestampMs.
const maxTraceTime = time.Duration(maxTimestampMs) * time.Millisecond

// csvHeader returns the columns of CSV format f, or nil if f is not one.
func csvHeader(f Format) []string {
	switch f {
	case FormatAzure:
		return azureHeader
	case FormatBurstGPT:
		return burstGPTHeader
	}
	return nil
}

// csvFormatOf returns the CSV format whose header line is, or "" if line
// is no CSV header. A leading UTF-8 byte order mark is ignored.
func csvFormatOf(line []byte) Format {
	line = bytes.TrimPrefix(line, []byte("\ufeff"))
	if len(line) == 0 || line[0] == '{' {
		return ""
	}
	r := csv.NewReader(bytes.NewReader(line))
	r.FieldsPerRecord = -1
	fields, err := r.Read()
	if err != nil {
		return ""
	}
	if _, err := r.Read(); err != io.EOF {
		return ""
	}
	for _, f := range []Format{FormatAzure, FormatBurstGPT} {
		if matchHeader(fields, csvHeader(f)) {
			return f
		}
	}
	return ""
}

func matchHeader(fields, want []string) bool {
	if len(fields) != len(want) {
		return false
	}
	for i, w := range want {
		if !strings.EqualFold(strings.TrimSpace(fields[i]), w) {
			return false
		}
	}
	return true
}

// csvStart looks at the first non-empty line of a trace read in format f
// and returns the CSV format to read it in, or "" for a JSON Lines trace.
// Under FormatAuto a CSV header selects its format; an explicit CSV format
// requires its header.
func csvStart(line []byte, f Format) (Format, error) {
	switch f {
	case FormatAuto:
		if cf := csvFormatOf(line); cf != "" || bytes.HasPrefix(line, []byte("{")) {
			return cf, nil
		}
		if bytes.HasPrefix(line, []byte{0x1f, 0x8b}) {
			return "", errors.New("the file is gzip-compressed: decompress it first (gunzip)")
		}
		got := string(line)
		if len(got) > 100 {
			got = got[:100] + "…"
		}
		return "", fmt.Errorf("first line %q is neither a JSON object (mooncake, gorgo) nor the header of azure (%s) or burstgpt (%s)", got, strings.Join(azureHeader, ","), strings.Join(burstGPTHeader, ","))
	case FormatAzure, FormatBurstGPT:
		if csvFormatOf(line) == f {
			return f, nil
		}
		got := string(line)
		if len(got) > 100 {
			got = got[:100] + "…"
		}
		return "", fmt.Errorf("want the %s header %q, got %q", f, strings.Join(csvHeader(f), ","), got)
	}
	return "", nil
}

// readCSV reads the rows of a CSV trace in format f (FormatAzure or
// FormatBurstGPT) from r, positioned just after the header, which was line
// headerLine of the file. See FormatAzure for the rules.
func readCSV(r io.Reader, name string, f Format, headerLine int) ([]Request, error) {
	cols := csvHeader(f)
	lim := &recordLimit{r: r}
	cr := csv.NewReader(lim)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	inCol, outCol := 1, 2
	if f == FormatBurstGPT {
		inCol, outCol = 2, 3
	}
	var (
		reqs    []Request
		ids     idArena
		nextID  uint64
		rows    int
		base    time.Time // FormatAzure: the first row's time
		prev    time.Duration
		prevRaw string
	)
	for {
		rec, err := cr.Read()
		lim.n = 0
		if err == io.EOF {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, &LineError{name, headerLine + pe.StartLine, fmt.Errorf("invalid CSV: %w", pe.Err)}
			}
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		line += headerLine
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue // a line of spaces, as blank lines (which csv skips)
		}
		if len(rec) != len(cols) {
			return nil, &LineError{name, line, fmt.Errorf("want %d columns (%s), got %d",
				len(cols), strings.Join(cols, ","), len(rec))}
		}
		fieldErr := func(col int, err error) error {
			l, _ := cr.FieldPos(col)
			return &LineError{name, headerLine + l, err}
		}

		raw := strings.TrimSpace(rec[0])
		var t time.Duration
		if f == FormatAzure {
			at, ok := parseDateTime(raw)
			if !ok {
				return nil, fieldErr(0, fmt.Errorf("invalid %s %q (want a date and time such as 2023-11-16 18:15:46.6805900)", cols[0], raw))
			}
			if rows == 0 {
				base = at
			}
			t = at.Sub(base)
			if t > maxTraceTime {
				return nil, fieldErr(0, fmt.Errorf("%s %s is more than %d years after the first row's",
					cols[0], raw, int(maxTraceTime.Hours()/(365.25*24))))
			}
		} else if t, err = parseSeconds(raw); err != nil {
			return nil, fieldErr(0, err)
		}
		if rows > 0 && t < prev {
			return nil, fieldErr(0, fmt.Errorf("%s %s is before the previous row's %s (traces must be time-ordered)",
				cols[0], raw, prevRaw))
		}
		rows++
		prev, prevRaw = t, raw

		in, err := parseTokens(rec[inCol], cols[inCol])
		if err != nil {
			return nil, fieldErr(inCol, err)
		}
		if in > MaxTokens {
			return nil, fieldErr(inCol, fmt.Errorf("%s %d is more than the limit of %d", cols[inCol], in, MaxTokens))
		}
		out, err := parseTokens(rec[outCol], cols[outCol])
		if err != nil {
			return nil, fieldErr(outCol, err)
		}
		if out > MaxTokens {
			return nil, fieldErr(outCol, fmt.Errorf("%s %d is more than the limit of %d", cols[outCol], out, MaxTokens))
		}
		if in == 0 {
			continue // nothing to prefill: not a request to route
		}
		if len(reqs) >= readLimit {
			return nil, &LineError{name, line, errTooMany}
		}
		hs := ids.alloc(BlockCount(in))
		for j := range hs {
			hs[j] = nextID
			nextID++
		}
		reqs = append(reqs, Request{
			Time:         t,
			Session:      string(f) + "-" + strconv.Itoa(line),
			Turn:         1,
			InputTokens:  in,
			OutputTokens: out,
			HashIDs:      hs,
		})
	}
	return reqs, nil
}

// parseTokens parses a non-negative token count of column col.
func parseTokens(s, col string) (int, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("invalid %s %q (want a whole number of tokens)", col, s)
	}
	if n < 0 {
		return 0, fmt.Errorf("%s must be non-negative, got %d", col, n)
	}
	return n, nil
}

// parseDateTime parses an Azure trace TIMESTAMP: "YYYY-MM-DD HH:MM:SS"
// ("T" may replace the space) with an optional fraction of any length after
// "." or ",", then an optional zone: "Z", "UTC" or an offset "+HH:MM",
// "+HHMM" or "+HH" (or "-"), possibly after a space. Without a zone the
// time is UTC.
func parseDateTime(s string) (time.Time, bool) {
	if len(s) < 11 || (s[10] != ' ' && s[10] != 'T') {
		return time.Time{}, false
	}
	clock, zone := s, ""
	if k := strings.IndexAny(s[11:], " +-ZU"); k >= 0 {
		clock, zone = s[:11+k], strings.TrimLeft(s[11+k:], " ")
	}
	var offset time.Duration
	switch zone {
	case "", "Z", "UTC":
	default:
		sign := time.Duration(1)
		switch zone[0] {
		case '+':
		case '-':
			sign = -1
		default:
			return time.Time{}, false
		}
		hh, mm, ok := zone[1:], "00", true
		switch {
		case len(hh) == 5 && hh[2] == ':':
			hh, mm = hh[:2], hh[3:]
		case len(hh) == 4:
			hh, mm = hh[:2], hh[2:]
		case len(hh) != 2:
			ok = false
		}
		h, err1 := strconv.ParseUint(hh, 10, 8)
		m, err2 := strconv.ParseUint(mm, 10, 8)
		if !ok || err1 != nil || err2 != nil || h > 23 || m > 59 {
			return time.Time{}, false
		}
		offset = sign * (time.Duration(h)*time.Hour + time.Duration(m)*time.Minute)
	}
	layout := "2006-01-02 15:04:05"
	if s[10] == 'T' {
		layout = "2006-01-02T15:04:05"
	}
	t, err := time.Parse(layout, clock)
	if err != nil {
		return time.Time{}, false
	}
	return t.Add(-offset), true
}

// parseSeconds converts a BurstGPT Timestamp, a decimal number of seconds,
// to a Duration, exactly when it has at most nine decimals.
func parseSeconds(s string) (time.Duration, error) {
	whole, frac, _ := strings.Cut(s, ".")
	if (whole != "" || frac != "") && len(whole) <= 10 && len(frac) <= 9 && allDigits(whole) && allDigits(frac) {
		var w, ns int64
		for i := range len(whole) {
			w = w*10 + int64(whole[i]-'0')
		}
		for i := range 9 {
			ns *= 10
			if i < len(frac) {
				ns += int64(frac[i] - '0')
			}
		}
		if w <= int64(maxTraceTime/time.Second) {
			if d := time.Duration(w)*time.Second + time.Duration(ns); d <= maxTraceTime {
				return d, nil
			}
		}
		return 0, fmt.Errorf("the Timestamp %s s is out of range", s)
	}
	x, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		return 0, fmt.Errorf("invalid Timestamp %q (want seconds from the start of the trace)", s)
	}
	if x < 0 {
		return 0, fmt.Errorf("the Timestamp must be non-negative, got %s", s)
	}
	if x*float64(time.Second) > float64(maxTraceTime) {
		return 0, fmt.Errorf("the Timestamp %s s is out of range", s)
	}
	return time.Duration(math.Round(x * float64(time.Second))), nil
}

func allDigits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// recordLimit fails a read once more than maxLineBytes have been read since
// the last record (n is reset by the caller).
type recordLimit struct {
	r io.Reader
	n int
}

func (l *recordLimit) Read(p []byte) (int, error) {
	if l.n > maxLineBytes {
		return 0, fmt.Errorf("a row longer than %d MiB (an unterminated quote?)", maxLineBytes>>20)
	}
	k, err := l.r.Read(p)
	l.n += k
	return k, err
}
