package enginemetrics

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
)

// Bounds on what Parse reads of an exposition: a hostile or broken replica
// must not grow the router. Parse reads the exposition line by line and
// hands the text parser only the lines of the families the dialects read
// (their samples, HELP and TYPE lines), so an exposition's other families,
// however many label sets they have, cost a scan and nothing more.
const (
	// MaxReadBytes bounds the lines of the families read: an exposition
	// whose lines of them take more is an error. Real ones take a few
	// kilobytes.
	MaxReadBytes = 1 << 20
	// MaxSeries bounds the label sets of one family read: more are an
	// error. A dialect's LoRAInfo family is not bound: only its sample of
	// greatest value is read.
	MaxSeries = 1024
	// MaxLabels bounds the labels of one sample read (vLLM's
	// cache_config_info has 33), and labelWork the sum over the samples
	// read of the square of their labels' count (the text parser's work
	// and garbage grow so with each sample's labels): more are an error.
	MaxLabels = 128
	labelWork = 1 << 18
	// maxNames bounds the names of other families remembered, for the
	// error of an exposition of no known engine.
	maxNames, maxNameBytes = 1024, 64 << 10
)

// processStartTime is read from every dialect's exposition.
const processStartTime = "process_start_time_seconds"

// filtered is an exposition's lines that Parse reads.
type filtered struct {
	text  bytes.Buffer
	lines []int // the exposition's line number of each line of text
	// latest is each LoRAInfo family's usable sample of greatest value
	// (its line, with its line number), added after the rest.
	latest map[string]*latestLine
	series map[string]int // sample lines kept, by family
	work   int            // the sum of their labels' count squared
	names  familyNames
	// lastType is the name and type of the last TYPE line, to name the
	// family of a histogram's or summary's sample lines.
	lastName, lastType []byte
}

type latestLine struct {
	line  []byte
	no    int
	value float64
}

// wanted are the families the dialects read: true for those of which only
// the sample of greatest value is (LoRAInfo).
func wanted() map[string]bool {
	w := map[string]bool{processStartTime: false}
	for i := range Dialects {
		Dialects[i].families(func(name string, latest bool) {
			if name != "" {
				w[name] = w[name] || latest
			}
		})
	}
	return w
}

// filter reads an exposition and keeps the lines of the wanted families
// (and every line it cannot read a name from, for the text parser to
// refuse). A last line without its newline is given one.
func filter(r io.Reader, want map[string]bool) (*filtered, error) {
	f := &filtered{latest: map[string]*latestLine{}, series: map[string]int{}}
	br := bufio.NewReaderSize(r, 64<<10)
	var long []byte
	for no := 1; ; no++ {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				if len(long) > MaxReadBytes {
					return nil, fmt.Errorf("line %d is longer than %d bytes", no, MaxReadBytes)
				}
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
		if len(line) > 0 {
			if line[len(line)-1] != '\n' {
				long = append(append(long[:0], line...), '\n')
				line = long
			}
			if err := f.line(line, no, want); err != nil {
				return nil, err
			}
		}
		if err == io.EOF {
			break
		}
	}
	for _, name := range slices.Sorted(maps.Keys(f.latest)) {
		l := f.latest[name]
		if err := f.keep(l.line, l.no); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// line judges one line (with its newline).
func (f *filtered) line(line []byte, no int, want map[string]bool) error {
	i := skipBlank(line, 0)
	switch line[i] {
	case '\n':
		return nil
	case '#':
		i = skipBlank(line, i+1)
		j := i
		for line[j] != ' ' && line[j] != '\t' && line[j] != '\n' {
			j++
		}
		keyword := string(line[i:j])
		if keyword != "HELP" && keyword != "TYPE" {
			return nil // a comment
		}
		name, k, ok := metricName(line, skipBlank(line, j))
		if !ok {
			return f.keep(line, no) // no labels: for the text parser to judge
		}
		if keyword == "TYPE" {
			k = skipBlank(line, k)
			e := k
			for line[e] != ' ' && line[e] != '\t' && line[e] != '\n' {
				e++
			}
			f.lastName, f.lastType = append(f.lastName[:0], name...), append(f.lastType[:0], line[k:e]...)
		}
		if _, ok := want[string(name)]; ok {
			return f.keep(line, no)
		}
		return nil
	}
	// A sample: name{labels} value [timestamp], or {"name",labels} ...
	var name []byte
	end, labels := 0, 0
	if line[i] == '{' {
		var ok bool
		if i = skipBlank(line, i+1); line[i] != '"' {
			return f.odd(line, no)
		}
		if name, end, ok = metricName(line, i); !ok {
			return f.odd(line, no)
		}
		end = skipBlank(line, end)
		if line[end] != ',' && line[end] != '}' {
			return f.odd(line, no)
		}
		if end, labels, ok = labelsEnd(line, end); !ok {
			return f.odd(line, no)
		}
	} else {
		var ok bool
		if name, end, ok = metricName(line, i); !ok || line[i] == '"' {
			return f.odd(line, no)
		}
		switch b := skipBlank(line, end); {
		case line[b] == '{': // the text parser allows blanks before the labels
			if end, labels, ok = labelsEnd(line, b+1); !ok {
				return f.odd(line, no)
			}
		case b > end:
		default:
			return f.odd(line, no)
		}
	}
	f.names.add(f.family(name))
	latest, ok := want[string(name)]
	switch {
	case !ok:
		return nil
	case labels > MaxLabels:
		return fmt.Errorf("line %d: a sample of %s has more than %d labels", no, name, MaxLabels)
	case latest:
		v, ok := sampleValue(line, end)
		if !ok {
			return f.keep(line, no) // for the text parser to refuse
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return nil // not read
		}
		l := f.latest[string(name)]
		if l == nil {
			l = &latestLine{value: math.Inf(-1)}
			f.latest[string(name)] = l
		}
		if v > l.value {
			l.line, l.no, l.value = append(l.line[:0], line...), no, v
		}
		return nil
	}
	if f.series[string(name)]++; f.series[string(name)] > MaxSeries {
		return fmt.Errorf("%s has more than %d label sets", name, MaxSeries)
	}
	if f.work += labels * labels; f.work > labelWork {
		return fmt.Errorf("line %d: the samples read have too many labels", no)
	}
	return f.keep(line, no)
}

// odd keeps a line that does not read as a sample, for the text parser to
// refuse; one with more than MaxLabels labels is refused here (the text
// parser's work grows with the square of a sample's labels).
func (f *filtered) odd(line []byte, no int) error {
	labels, quoted := 0, false
	for i := 0; i < len(line); i++ {
		switch {
		case quoted && line[i] == '\\':
			i++
		case line[i] == '"':
			quoted = !quoted
		case !quoted && line[i] == '=':
			labels++
		}
	}
	if f.work += labels * labels; labels > MaxLabels || f.work > labelWork {
		return fmt.Errorf("line %d: malformed, with %d labels", no, labels)
	}
	return f.keep(line, no)
}

// keep adds a line to the text parsed.
func (f *filtered) keep(line []byte, no int) error {
	if f.text.Len()+len(line) > MaxReadBytes {
		return fmt.Errorf("the families read take more than %d bytes", MaxReadBytes)
	}
	f.text.Write(line)
	f.lines = append(f.lines, no)
	return nil
}

// family is the family a sample's name belongs to: a histogram's or a
// summary's (by the TYPE line before) for its _bucket, _sum and _count.
func (f *filtered) family(name []byte) []byte {
	switch string(f.lastType) {
	case "histogram", "gaugehistogram", "summary":
		if rest, ok := bytes.CutPrefix(name, f.lastName); ok {
			switch string(rest) {
			case "_bucket", "_sum", "_count", "_gcount", "_gsum":
				return f.lastName
			}
		}
	}
	return name
}

// familyNames are the names of the families an exposition has, at most
// maxNames of them.
type familyNames struct {
	set   map[string]struct{}
	bytes int
	more  bool
}

func (n *familyNames) add(name []byte) {
	if _, ok := n.set[string(name)]; ok {
		return
	}
	if len(n.set) >= maxNames || n.bytes+len(name) > maxNameBytes {
		n.more = true
		return
	}
	if n.set == nil {
		n.set = map[string]struct{}{}
	}
	n.set[string(name)] = struct{}{}
	n.bytes += len(name)
}

// sorted returns the names, sorted.
func (n *familyNames) sorted() []string { return slices.Sorted(maps.Keys(n.set)) }

// skipBlank returns the index of the first byte at or after i that is not
// a space or a tab (lines end with a newline).
func skipBlank(line []byte, i int) int {
	for line[i] == ' ' || line[i] == '\t' {
		i++
	}
	return i
}

// metricName reads a metric name at i, bare or quoted ("" and nil if
// neither starts there), and returns the index after it; ok is false for
// a quoted name not closed on the line.
func metricName(line []byte, i int) (name []byte, end int, ok bool) {
	if line[i] == '"' {
		j := i + 1
		for ; line[j] != '"'; j++ {
			switch line[j] {
			case '\\':
				j++
				if line[j] == '\n' {
					return nil, j, false
				}
			case '\n':
				return nil, j, false
			}
		}
		return line[i+1 : j], j + 1, true
	}
	j := i
	for ; j < len(line); j++ {
		b := line[j]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b == '_' || b == ':' || j > i && b >= '0' && b <= '9') {
			break
		}
	}
	if j == i {
		return nil, j, false
	}
	return line[i:j], j, true
}

// labelsEnd returns the index after the '}' that closes a label set begun
// before i, skipping quoted values, and how many labels it has; ok is
// false if the line has none.
func labelsEnd(line []byte, i int) (end, labels int, ok bool) {
	quoted := false
	for ; line[i] != '\n'; i++ {
		switch {
		case quoted && line[i] == '\\':
			if line[i+1] == '\n' {
				return i, labels, false
			}
			i++
		case line[i] == '"':
			quoted = !quoted
		case !quoted && line[i] == '=':
			labels++
		case !quoted && line[i] == '}':
			return i + 1, labels, true
		}
	}
	return i, labels, false
}

// sampleValue reads a sample's value after its name and labels, as the
// text parser does.
func sampleValue(line []byte, i int) (float64, bool) {
	i = skipBlank(line, i)
	j := i
	for line[j] != ' ' && line[j] != '\t' && line[j] != '\n' {
		j++
	}
	s := string(line[i:j])
	if s == "" || bytes.ContainsAny(line[i:j], "pP_") {
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}
