package trace

import (
	"bytes"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	azureHead = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	burstHead = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
)

// The first three rows are those of AzureLLMInferenceTrace_conv.csv; the
// others try the timestamp forms, a skipped row and CRLF line ends.
const azureIn = azureHead +
	"2023-11-16 18:15:46.6805900,374,44\n" + // line 2
	"2023-11-16 18:15:50.9951690,396,109\n" +
	"\n" +
	"2023-11-16 18:15:51.2224670,879,55\r\n" + // line 5
	"2023-11-16 18:15:51.2224670,0,12\n" + // skipped: no prompt
	"2023-11-16 18:15:52,1024,0\n" +
	"2023-11-16T18:15:53.5+00:00,1025,3\n" +
	"   \n" +
	"2023-11-16 19:15:54.123456789123 +01:00, 1 ,1\n" // line 10

func azureWant() []Request {
	const ms = time.Millisecond
	return []Request{
		{Time: 0, Session: "azure-2", Turn: 1, InputTokens: 374, OutputTokens: 44, HashIDs: []uint64{0}},
		{Time: 4314579 * time.Microsecond, Session: "azure-3", Turn: 1, InputTokens: 396, OutputTokens: 109, HashIDs: []uint64{1}},
		{Time: 4541877 * time.Microsecond, Session: "azure-5", Turn: 1, InputTokens: 879, OutputTokens: 55, HashIDs: []uint64{2, 3}},
		{Time: 5319410 * time.Microsecond, Session: "azure-7", Turn: 1, InputTokens: 1024, OutputTokens: 0, HashIDs: []uint64{4, 5}},
		{Time: 6819410 * time.Microsecond, Session: "azure-8", Turn: 1, InputTokens: 1025, OutputTokens: 3, HashIDs: []uint64{6, 7, 8}},
		{Time: 7442*ms + 866789, Session: "azure-10", Turn: 1, InputTokens: 1, OutputTokens: 1, HashIDs: []uint64{9}},
	}
}

func TestReadAzure(t *testing.T) {
	for _, f := range []Format{FormatAzure, FormatAuto, ""} {
		got, err := Read(strings.NewReader(azureIn), "a.csv", f)
		if err != nil {
			t.Fatalf("format %q: %v", f, err)
		}
		if want := azureWant(); !reflect.DeepEqual(got, want) {
			t.Errorf("format %q: Read =\n%+v\nwant\n%+v", f, got, want)
		}
	}
}

const burstIn = burstHead +
	"5,ChatGPT,472,18,490,Conversation log\n" + // line 2
	"45.25,ChatGPT,1087,230,1317,Conversation log\n" +
	"45.25,GPT-4,0,0,0,API log\n" + // skipped: no prompt
	"118,GPT-4,1025,0,1025,API log\n" + // a failure: kept, output 0
	`"118.000000001","GPT-4","512"," 7 ",519,"API log"` + "\n" // line 6

func burstWant() []Request {
	return []Request{
		{Time: 5 * time.Second, Session: "burstgpt-2", Turn: 1, InputTokens: 472, OutputTokens: 18, HashIDs: []uint64{0}},
		{Time: 45250 * time.Millisecond, Session: "burstgpt-3", Turn: 1, InputTokens: 1087, OutputTokens: 230, HashIDs: []uint64{1, 2, 3}},
		{Time: 118 * time.Second, Session: "burstgpt-5", Turn: 1, InputTokens: 1025, OutputTokens: 0, HashIDs: []uint64{4, 5, 6}},
		{Time: 118*time.Second + 1, Session: "burstgpt-6", Turn: 1, InputTokens: 512, OutputTokens: 7, HashIDs: []uint64{7}},
	}
}

func TestReadBurstGPT(t *testing.T) {
	for _, f := range []Format{FormatBurstGPT, FormatAuto, ""} {
		got, err := Read(strings.NewReader(burstIn), "b.csv", f)
		if err != nil {
			t.Fatalf("format %q: %v", f, err)
		}
		if want := burstWant(); !reflect.DeepEqual(got, want) {
			t.Errorf("format %q: Read =\n%+v\nwant\n%+v", f, got, want)
		}
	}
}

// TestReadCSVBlocks checks the block assignment on a larger trace: every
// request has BlockCount(InputTokens) ids, no id is held by two requests,
// every request is its own session, and so the trace has no reuse.
func TestReadCSVBlocks(t *testing.T) {
	var b strings.Builder
	b.WriteString(burstHead)
	for i := range 500 {
		b.WriteString(strings.Join([]string{
			strconv.FormatFloat(float64(i)/8, 'f', -1, 64), "ChatGPT",
			[]string{"1", "511", "512", "513", "4000", "70000"}[i%6], "3", "0", "Conversation log"}, ","))
		b.WriteString("\n")
	}
	reqs, err := Read(strings.NewReader(b.String()), "big.csv", FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 500 {
		t.Fatalf("%d requests, want 500", len(reqs))
	}
	seen := map[uint64]bool{}
	sessions := map[string]bool{}
	for i, r := range reqs {
		if want := time.Duration(i) * time.Second / 8; r.Time != want {
			t.Fatalf("request %d: time %v, want %v", i, r.Time, want)
		}
		if len(r.HashIDs) != BlockCount(r.InputTokens) || cap(r.HashIDs) != len(r.HashIDs) {
			t.Fatalf("request %d: %d ids (cap %d) for %d tokens", i, len(r.HashIDs), cap(r.HashIDs), r.InputTokens)
		}
		for _, id := range r.HashIDs {
			if seen[id] {
				t.Fatalf("request %d: id %d already held by another request", i, id)
			}
			seen[id] = true
		}
		if sessions[r.Session] || r.Turn != 1 || r.User != "" {
			t.Fatalf("request %d: session %q turn %d user %q, want a new session at turn 1 and no user", i, r.Session, r.Turn, r.User)
		}
		sessions[r.Session] = true
	}
	st := ComputeStats(reqs)
	if st.Sessions != 500 || st.Users != 500 || st.MultiTurnSessions != 0 || st.MultiTurnShare != 0 || st.Reuse != (Reuse{}) {
		t.Errorf("stats = %+v, want 500 single-request sessions and users, no reuse", st)
	}
	var out bytes.Buffer
	if err := st.WriteText(&out); err != nil || !strings.Contains(out.String(), " 0.00% of input tokens") {
		t.Errorf("stats text (%v):\n%s", err, out.String())
	}
	if got := DeriveSessions(append([]Request(nil), reqs...)); got != 500 {
		t.Errorf("DeriveSessions finds %d sessions, want 500", got)
	}
}

func TestReadCSVAutoDetect(t *testing.T) {
	tests := []struct {
		name, in, wantSession string
	}{
		{"azure, spaces and case", " timestamp , CONTEXTTOKENS,generatedTokens\t\n2023-11-16 18:15:46,1,1\n", "azure-2"},
		{"azure after blank lines and a BOM", "\n  \n\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\r\n\r\n2023-11-16 18:15:46,1,1\r\n", "azure-5"},
		{"azure, quoted header", `"TIMESTAMP","ContextTokens","GeneratedTokens"` + "\n2023-11-16 18:15:46,1,1\n", "azure-2"},
		{"burstgpt, case", "timestamp,model,request tokens,response tokens,total tokens,log type\n0,m,1,1,2,API log", "burstgpt-2"},
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
	// A header alone, or an empty file in a CSV format, is an empty trace,
	// as an empty JSON Lines file is.
	for _, in := range []struct {
		in string
		f  Format
	}{{azureHead, FormatAuto}, {burstHead, FormatAuto}, {strings.TrimSpace(azureHead), FormatAzure},
		{"", FormatAzure}, {"\n\n", FormatBurstGPT}, {burstHead + "\n \n", FormatBurstGPT}} {
		got, err := Read(strings.NewReader(in.in), "empty", in.f)
		if err != nil || len(got) != 0 {
			t.Errorf("Read(%q, %s) = %v, %v; want no requests", in.in, in.f, got, err)
		}
	}
}

func TestReadCSVErrors(t *testing.T) {
	const a0 = "2023-11-16 18:15:46.5,100,1\n"
	const b0 = "5,ChatGPT,100,1,101,API log\n"
	tests := []struct {
		name string
		f    Format
		in   string
		want string
	}{
		{"not the azure header", FormatAzure, "x,y,z\n" + a0,
			`t.csv:1: want the azure header "TIMESTAMP,ContextTokens,GeneratedTokens", got "x,y,z"`},
		{"burstgpt header as azure", FormatAzure, "\n" + burstHead + b0,
			`t.csv:2: want the azure header "TIMESTAMP,ContextTokens,GeneratedTokens", got "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"`},
		{"JSON as burstgpt", FormatBurstGPT, `{"timestamp": 0}`,
			`t.csv:1: want the burstgpt header "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", got "{\"timestamp\": 0}"`},
		{"long bad header", FormatAzure, strings.Repeat("x", 150),
			`t.csv:1: want the azure header "TIMESTAMP,ContextTokens,GeneratedTokens", got "` + strings.Repeat("x", 100) + `…"`},
		{"extra header column", FormatAzure, "TIMESTAMP,ContextTokens,GeneratedTokens,Extra\n",
			`t.csv:1: want the azure header "TIMESTAMP,ContextTokens,GeneratedTokens", got "TIMESTAMP,ContextTokens,GeneratedTokens,Extra"`},
		{"CSV header as mooncake", FormatMooncake, azureHead,
			"t.csv:1: invalid JSON: invalid character 'T' looking for beginning of value"},
		{"too few columns", FormatAuto, azureHead + a0 + "2023-11-16 18:15:47,1\n",
			"t.csv:3: want 3 columns (TIMESTAMP,ContextTokens,GeneratedTokens), got 2"},
		{"too many columns", FormatAuto, burstHead + b0 + "\n" + b0[:len(b0)-1] + ",x\n",
			"t.csv:4: want 6 columns (Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type), got 7"},
		{"bad quote", FormatAuto, azureHead + a0 + `2023-11-16 18:15:47,1"2,3` + "\n",
			`t.csv:3: invalid CSV: bare " in non-quoted-field`},
		{"unterminated quote", FormatAuto, azureHead + a0 + `2023-11-16 18:15:47,"1,3` + "\n" + a0, // reported where its row starts
			`t.csv:3: invalid CSV: extraneous or missing " in quoted-field`},
		{"field on a later line", FormatAuto, azureHead + `"2023-11-16 18:15:47",` + "\"1\n2\",3\n",
			`t.csv:2: invalid ContextTokens "1\n2" (want a whole number of tokens)`},
		{"bad timestamp", FormatAuto, azureHead + "2023-11-16,1,1\n",
			`t.csv:2: invalid TIMESTAMP "2023-11-16" (want a date and time such as 2023-11-16 18:15:46.6805900)`},
		{"bad zone", FormatAuto, azureHead + a0 + "2023-11-16 18:15:47+25:00,1,1\n",
			`t.csv:3: invalid TIMESTAMP "2023-11-16 18:15:47+25:00" (want a date and time such as 2023-11-16 18:15:46.6805900)`},
		{"azure backwards", FormatAuto, azureHead + a0 + a0 + "2023-11-16 18:15:46.4,1,1\n",
			"t.csv:4: TIMESTAMP 2023-11-16 18:15:46.4 is before the previous row's 2023-11-16 18:15:46.5 (traces must be time-ordered)"},
		{"azure backwards across a zone", FormatAuto, azureHead + a0 + "2023-11-16 19:15:46.4+01:00,1,1\n",
			"t.csv:3: TIMESTAMP 2023-11-16 19:15:46.4+01:00 is before the previous row's 2023-11-16 18:15:46.5 (traces must be time-ordered)"},
		{"backwards after a skipped row", FormatAuto, azureHead + a0 + "2023-11-16 18:15:50,0,1\n" + "2023-11-16 18:15:49,1,1\n",
			"t.csv:4: TIMESTAMP 2023-11-16 18:15:49 is before the previous row's 2023-11-16 18:15:50 (traces must be time-ordered)"},
		{"azure span too long", FormatAuto, azureHead + "1900-01-01 00:00:00,1,1\n2100-01-01 00:00:00,1,1\n",
			"t.csv:3: TIMESTAMP 2100-01-01 00:00:00 is more than 146 years after the first row's"},
		{"bad context", FormatAuto, azureHead + "2023-11-16 18:15:46,abc,1\n",
			`t.csv:2: invalid ContextTokens "abc" (want a whole number of tokens)`},
		{"fractional context", FormatAuto, azureHead + "2023-11-16 18:15:46,1.5,1\n",
			`t.csv:2: invalid ContextTokens "1.5" (want a whole number of tokens)`},
		{"empty generated", FormatAuto, azureHead + "2023-11-16 18:15:46,1,\n",
			`t.csv:2: invalid GeneratedTokens "" (want a whole number of tokens)`},
		{"huge context", FormatAuto, azureHead + "2023-11-16 18:15:46,99999999999999999999,1\n",
			`t.csv:2: invalid ContextTokens "99999999999999999999" (want a whole number of tokens)`},
		{"negative context", FormatAuto, azureHead + "2023-11-16 18:15:46,-3,1\n",
			"t.csv:2: ContextTokens must be non-negative, got -3"},
		{"negative generated", FormatAuto, azureHead + a0 + "2023-11-16 18:15:46.5,3,-1\n",
			"t.csv:3: GeneratedTokens must be non-negative, got -1"},
		{"context over the limit", FormatAuto, azureHead + "2023-11-16 18:15:46,16777217,1\n",
			"t.csv:2: ContextTokens 16777217 is more than the limit of 16777216"},
		{"generated over the limit", FormatAuto, azureHead + "2023-11-16 18:15:46,3,16777217\n",
			"t.csv:2: GeneratedTokens 16777217 is more than the limit of 16777216"},
		{"bad burstgpt timestamp", FormatAuto, burstHead + b0 + "1:00,ChatGPT,1,1,2,API log\n",
			`t.csv:3: invalid Timestamp "1:00" (want seconds from the start of the trace)`},
		{"NaN timestamp", FormatAuto, burstHead + "NaN,ChatGPT,1,1,2,API log\n",
			`t.csv:2: invalid Timestamp "NaN" (want seconds from the start of the trace)`},
		{"negative burstgpt timestamp", FormatAuto, burstHead + "-1,ChatGPT,1,1,2,API log\n",
			"t.csv:2: the Timestamp must be non-negative, got -1"},
		{"huge burstgpt timestamp", FormatAuto, burstHead + "1e300,ChatGPT,1,1,2,API log\n",
			"t.csv:2: the Timestamp 1e300 s is out of range"},
		{"huge exact burstgpt timestamp", FormatAuto, burstHead + "9999999999.5,ChatGPT,1,1,2,API log\n",
			"t.csv:2: the Timestamp 9999999999.5 s is out of range"},
		{"burstgpt backwards", FormatAuto, burstHead + b0 + "4.5,ChatGPT,1,1,2,API log\n",
			"t.csv:3: Timestamp 4.5 is before the previous row's 5 (traces must be time-ordered)"},
		{"bad request tokens", FormatAuto, burstHead + "5,ChatGPT,x,1,2,API log\n",
			`t.csv:2: invalid Request tokens "x" (want a whole number of tokens)`},
		{"negative response tokens", FormatBurstGPT, "\n\n" + burstHead + "\n" + "5,ChatGPT,1,-1,0,API log\n",
			"t.csv:5: Response tokens must be non-negative, got -1"},
	}
	for _, tt := range tests {
		_, err := Read(strings.NewReader(tt.in), "t.csv", tt.f)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: error = %v\nwant %s", tt.name, err, tt.want)
		}
	}
}

func TestParseDateTime(t *testing.T) {
	base := time.Date(2023, 11, 16, 18, 15, 46, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"2023-11-16 18:15:46.6805900", base.Add(680590 * time.Microsecond), true},
		{"2023-11-16 18:15:46", base, true},
		{"2023-11-16 18:15:46.5", base.Add(500 * time.Millisecond), true},
		{"2023-11-16 18:15:46,25", base.Add(250 * time.Millisecond), true},
		{"2023-11-16 18:15:46.1234567891234", base.Add(123456789), true},
		{"2023-11-16T18:15:46Z", base, true},
		{"2023-11-16 18:15:46 UTC", base, true},
		{"2023-11-16 18:15:46.000001+00:00", base.Add(time.Microsecond), true},
		{"2023-11-16 20:15:46+0200", base, true},
		{"2023-11-16 16:15:46-02", base, true},
		{"2023-11-16 14:45:46.5 -03:30", base.Add(500 * time.Millisecond), true},
		{"2023-11-16 8:15:46", base.Add(-10 * time.Hour), true},
		{"2023-11-16", time.Time{}, false},
		{"2023-11-16 18:15", time.Time{}, false},
		{"2023-11-16 18:15:46.", time.Time{}, false},
		{"2023-11-16 18:15:60", time.Time{}, false},
		{"2023-02-30 18:15:46", time.Time{}, false},
		{"2023-11-16 18:15:46+1", time.Time{}, false},
		{"2023-11-16 18:15:46+01:60", time.Time{}, false},
		{"2023-11-16 18:15:46+0a", time.Time{}, false},
		{"2023-11-16 18:15:46 PST", time.Time{}, false},
		{"2023-11-16 18:15:46Zx", time.Time{}, false},
		{"2023-11-16_18:15:46", time.Time{}, false},
		{"1700158546", time.Time{}, false},
	}
	for _, tt := range tests {
		got, ok := parseDateTime(tt.in)
		if ok != tt.ok || !got.Equal(tt.want) {
			t.Errorf("parseDateTime(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseSeconds(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"0", 0},
		{"5", 5 * time.Second},
		{"45.25", 45250 * time.Millisecond},
		{".5", 500 * time.Millisecond},
		{"7.", 7 * time.Second},
		{"5270400.000000001", 5270400*time.Second + 1},
		{"4611686018.427", maxTraceTime},
		{"4611686018.426999999", maxTraceTime - 1},
		{"1.0000000004", time.Second}, // more than 9 decimals: rounded to the ns
		{"1e3", 1000 * time.Second},
		{"+2.5", 2500 * time.Millisecond},
	}
	for _, tt := range tests {
		got, err := parseSeconds(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("parseSeconds(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"", ".", "1.2.3", "Inf", "-Inf", "nan", "0x", "1,5", "4611686018.427000001", "4611686019", "9999999999"} {
		if got, err := parseSeconds(in); err == nil {
			t.Errorf("parseSeconds(%q) = %v, want an error", in, got)
		}
	}
}

// TestParseMillisRange checks that 13-digit millisecond times, which Write
// emits for CSV traces spanning more than 31 years, read back exactly.
func TestParseMillisRange(t *testing.T) {
	for _, d := range []time.Duration{maxTraceTime, maxTraceTime - 1, 1e18 + 100, 3124137600000*time.Millisecond + 100} {
		got, err := parseMillis(formatMillis(d))
		if err != nil || got != d {
			t.Errorf("parseMillis(%s) = %v, %v; want %v", formatMillis(d), got, err, d)
		}
	}
	for _, s := range []string{"4611686018427.000001", "9999999999999.5", "4611686018428"} {
		if got, err := parseMillis(s); err == nil {
			t.Errorf("parseMillis(%s) = %v, want out of range", s, got)
		}
	}
}

// TestCSVRoundTrip checks that CSV traces survive Write and Read as gorgo.
func TestCSVRoundTrip(t *testing.T) {
	for _, in := range []string{azureIn, burstIn} {
		reqs, err := Read(strings.NewReader(in), "in.csv", FormatAuto)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := Write(&b, reqs); err != nil {
			t.Fatal(err)
		}
		got, err := Read(&b, "rt.jsonl", FormatAuto)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, reqs) {
			t.Errorf("round trip changed the requests:\n%+v\n%+v", reqs, got)
		}
	}
}

// FuzzReadCSV checks that the CSV readers never panic, that what they
// accept obeys the block and session rules, and that it survives a
// Write/Read round trip. The header is given, so the fuzzer works on rows.
func FuzzReadCSV(f *testing.F) {
	f.Add(azureIn[len(azureHead):], false)
	f.Add(burstIn[len(burstHead):], true)
	f.Add("2023-11-16 18:15:46,\"1\n\",2\n", false)
	f.Add("1900-01-01 00:00:00,1,1\n2046-01-01 00:00:00.0000001,1,1\n", false)
	f.Add("0.5,m,513,0,0,x\n1e9,m,1,1,1,y\n", true)
	f.Fuzz(func(t *testing.T, body string, burst bool) {
		in, format := azureHead+body, FormatAzure
		if burst {
			in, format = burstHead+body, FormatBurstGPT
		}
		reqs, err := Read(strings.NewReader(in), "fuzz.csv", FormatAuto)
		again, err2 := Read(strings.NewReader(in), "fuzz.csv", format)
		if (err == nil) != (err2 == nil) || !reflect.DeepEqual(reqs, again) {
			t.Fatalf("auto and %s disagree: %v / %v", format, err, err2)
		}
		if err != nil {
			return
		}
		ids := map[uint64]bool{}
		sessions := map[string]bool{}
		for i, r := range reqs {
			if i > 0 && r.Time < reqs[i-1].Time {
				t.Fatalf("request %d goes back in time", i)
			}
			if r.InputTokens <= 0 || len(r.HashIDs) != BlockCount(r.InputTokens) || r.Turn != 1 || sessions[r.Session] {
				t.Fatalf("request %d breaks the rules: %+v", i, r)
			}
			sessions[r.Session] = true
			for _, id := range r.HashIDs {
				if ids[id] {
					t.Fatalf("request %d: id %d held twice", i, id)
				}
				ids[id] = true
			}
		}
		var b bytes.Buffer
		if err := Write(&b, reqs); err != nil {
			t.Fatalf("Write of a trace Read accepted: %v", err)
		}
		rt, err := Read(&b, "fuzz-rt", FormatGorgo)
		if err != nil {
			t.Fatalf("Read of Write's output: %v", err)
		}
		if len(reqs) > 0 && !reflect.DeepEqual(rt, reqs) {
			t.Fatalf("round trip changed the requests:\n%+v\n%+v", reqs, rt)
		}
	})
}

func BenchmarkReadAzure(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(azureHead)
	base := time.Date(2024, 5, 10, 0, 0, 0, 0, time.UTC)
	for i := range 100000 {
		sb.WriteString(base.Add(time.Duration(i) * 37 * time.Millisecond).Format("2006-01-02 15:04:05.000000+00:00"))
		sb.WriteString("," + strconv.Itoa(100+i%5000) + "," + strconv.Itoa(i%300) + "\n")
	}
	data := sb.String()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Read(strings.NewReader(data), "azure", FormatAuto); err != nil {
			b.Fatal(err)
		}
	}
}
