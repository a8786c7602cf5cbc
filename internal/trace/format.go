package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Format names a trace file format.
type Format string

const (
	// FormatAuto detects the format from the first non-empty line: the
	// header of a CSV format (see FormatAzure and FormatBurstGPT) selects
	// that format; otherwise the line is JSON, and a line with a
	// "session_id" key is gorgo, anything else is Mooncake.
	// The zero Format means FormatAuto.
	FormatAuto Format = "auto"
	// FormatMooncake is Mooncake's JSON Lines trace: one object per line with
	// "timestamp" (ms, may be fractional), "input_length" (tokens),
	// "output_length" (tokens) and "hash_ids" (prefix-chained ids of the
	// prompt's 512-token blocks). Other keys are ignored. Sessions are derived
	// with DeriveSessions.
	FormatMooncake Format = "mooncake"
	// FormatGorgo is gorgo's JSON Lines trace: Mooncake's four keys plus
	// "session_id" (required, non-empty) and the optional "turn" (>= 1),
	// "user_id", "model" (the model the request names: a base model or a
	// LoRA adapter; absent or "" = none) and "messages"
	// ([{"role":..,"content":..}]).
	FormatGorgo Format = "gorgo"
	// FormatAzure is the Azure LLM inference trace CSV published with
	// Splitwise (AzureLLMInferenceTrace_conv.csv and _code.csv) and DynamoLLM
	// (the week-long 2024 files): the header
	// "TIMESTAMP,ContextTokens,GeneratedTokens", then one row per request.
	// TIMESTAMP is a date and time such as "2023-11-16 18:15:46.6805900":
	// "T" may replace the space, the fraction may have any number of digits
	// or be absent, and a zone may follow ("Z", "UTC", "+00:00", "+0000",
	// "+00"; none means UTC). A request's Time is its offset from the first
	// row's TIMESTAMP. ContextTokens is the prompt length and GeneratedTokens
	// the output length.
	//
	// Rules of both CSV formats: the header must be the first non-empty line
	// (column names match case-insensitively, spaces around them ignored);
	// every row has the header's number of columns; token counts are
	// non-negative integers, prompts at most 2^24 tokens; times are
	// non-decreasing (equal times are allowed); blank lines are skipped.
	// Rows with a prompt of 0 tokens are skipped (there is nothing to prefill
	// or route), though their times count for the order; an output of 0
	// tokens is kept as 0 (see Request.OutputTokens).
	//
	// CSV traces have no prefix information, so every request's blocks are
	// its own: a request gets BlockCount(prompt) fresh ids, numbered
	// consecutively from 0 in file order, which no other request of the trace
	// holds. Each request is a session of its own, named after the format and
	// the line its row starts on ("azure-2" is the row after the header on
	// line 1), with Turn 1 and no User. No policy can win by cache on such a
	// trace (its prefix reuse is 0): what it tests is load and burstiness.
	FormatAzure Format = "azure"
	// FormatBurstGPT is BurstGPT's CSV (BurstGPT_1.csv,
	// BurstGPT_without_fails_1.csv, …): the header
	// "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
	// then one row per request. Timestamp is seconds from the start of the
	// trace (fractional or not) and is the request's Time as it is; Request
	// tokens is the prompt length and Response tokens the output length.
	// Model, Total tokens and Log Type ("Conversation log" or "API log") are
	// not used. Rows with Response tokens 0 are BurstGPT's failed requests:
	// they are kept, with OutputTokens 0. The rules, blocks and sessions
	// ("burstgpt-2", …) are those of FormatAzure.
	FormatBurstGPT Format = "burstgpt"
)

// Formats returns the valid format names.
func Formats() []Format {
	return []Format{FormatAuto, FormatMooncake, FormatGorgo, FormatAzure, FormatBurstGPT}
}

// ParseFormat returns the Format named s (case-insensitive, surrounding
// spaces ignored); the empty string is FormatAuto.
func ParseFormat(s string) (Format, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return FormatAuto, nil
	}
	for _, f := range Formats() {
		if s == string(f) {
			return f, nil
		}
	}
	return "", fmt.Errorf("unknown trace format %q (valid: %s)", s, formatNames())
}

func formatNames() string {
	var names []string
	for _, f := range Formats() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

// maxTimestampMs bounds timestamps (ms) so that they fit a time.Duration
// with room to spare: about 292 years / 2.
const maxTimestampMs = float64(math.MaxInt64/int64(time.Millisecond)) / 2

// record is one line of a trace file. Pointers tell absent keys from zeros.
type record struct {
	Timestamp    json.RawMessage `json:"timestamp"` // a number (json.Number took a string of one)
	SessionID    *string         `json:"session_id,omitempty"`
	Turn         *int            `json:"turn,omitempty"`
	UserID       string          `json:"user_id,omitempty"`
	Model        string          `json:"model,omitempty"`
	Tenant       string          `json:"tenant,omitempty"`
	Priority     string          `json:"priority,omitempty"`
	InputLength  *int            `json:"input_length"`
	OutputLength *int            `json:"output_length"`
	HashIDs      []uint64        `json:"hash_ids"`
	Messages     []Message       `json:"messages,omitempty"`
}

// request converts a decoded record to a Request, checking every rule of
// format f (FormatMooncake or FormatGorgo).
func (rec *record) request(f Format) (Request, error) {
	ts := bytes.TrimSpace(rec.Timestamp)
	switch {
	case len(ts) == 0 || string(ts) == "null":
		return Request{}, errors.New("missing timestamp")
	case ts[0] != '-' && (ts[0] < '0' || ts[0] > '9'):
		what := map[byte]string{'"': "a string", 't': "true or false", 'f': "true or false", '[': "a list", '{': "an object"}[ts[0]]
		return Request{}, fmt.Errorf("timestamp: %s is not a number", what)
	}
	t, err := parseMillis(string(ts))
	if err != nil {
		return Request{}, err
	}
	if rec.InputLength == nil {
		return Request{}, errors.New("missing input_length")
	}
	if rec.OutputLength == nil {
		return Request{}, errors.New("missing output_length")
	}
	if rec.HashIDs == nil {
		return Request{}, errors.New("missing hash_ids")
	}
	r := Request{
		Time:         t,
		InputTokens:  *rec.InputLength,
		OutputTokens: *rec.OutputLength,
		HashIDs:      rec.HashIDs,
	}
	if f == FormatGorgo {
		if rec.SessionID == nil || *rec.SessionID == "" {
			return Request{}, errors.New("missing session_id (required in gorgo format)")
		}
		r.Session = *rec.SessionID
		if rec.Turn != nil {
			if *rec.Turn < 1 {
				return Request{}, fmt.Errorf("turn must be at least 1, got %d", *rec.Turn)
			}
			r.Turn = *rec.Turn
		}
		r.User = rec.UserID
		r.Model = rec.Model
		r.Tenant, r.Priority = rec.Tenant, rec.Priority
		if len(rec.Messages) > 0 {
			r.Messages = rec.Messages
		}
	}
	if err := validate(&r); err != nil {
		return Request{}, err
	}
	return r, nil
}

// validate checks the rules every Request of a trace obeys, whatever its
// format (times are checked for order by the caller).
func validate(r *Request) error {
	if r.Time < 0 {
		return fmt.Errorf("timestamp must be non-negative, got %v", r.Time)
	}
	if r.InputTokens <= 0 {
		return fmt.Errorf("input_length must be positive, got %d", r.InputTokens)
	}
	if r.InputTokens > MaxTokens {
		return fmt.Errorf("input_length %d is more than the limit of %d", r.InputTokens, MaxTokens)
	}
	if r.OutputTokens < 0 {
		return fmt.Errorf("output_length must be non-negative, got %d", r.OutputTokens)
	}
	if r.OutputTokens > MaxTokens {
		return fmt.Errorf("output_length %d is more than the limit of %d", r.OutputTokens, MaxTokens)
	}
	if r.Tenant != "" || r.Priority != "" {
		if err := checkTenant(r.Tenant, r.Priority); err != nil {
			return err
		}
	}
	if want := BlockCount(r.InputTokens); len(r.HashIDs) != want {
		return fmt.Errorf("len(hash_ids)=%d does not match input_length %d (want ceil(%d/%d)=%d)",
			len(r.HashIDs), r.InputTokens, r.InputTokens, BlockTokens, want)
	}
	if r.Turn < 0 {
		return fmt.Errorf("turn must be at least 1, got %d", r.Turn)
	}
	return nil
}

// parseMillis converts a JSON number of milliseconds to a Duration, exactly
// when it has at most six decimals (nanosecond resolution), so that every
// time Write writes reads back unchanged.
func parseMillis(s string) (time.Duration, error) {
	if i := strings.IndexByte(s, '.'); i >= 0 && !strings.ContainsAny(s, "eE-+") && len(s)-i-1 <= 6 && i <= 13 {
		whole, err1 := strconv.ParseInt(s[:i], 10, 64)
		frac := s[i+1:]
		n, err2 := strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
		if err1 == nil && err2 == nil {
			if float64(whole) > maxTimestampMs {
				return 0, fmt.Errorf("timestamp %s ms out of range", s)
			}
			d := time.Duration(whole)*time.Millisecond + time.Duration(n)
			if d > maxTraceTime {
				return 0, fmt.Errorf("timestamp %s ms out of range", s)
			}
			return d, nil
		}
	}
	if !strings.ContainsAny(s, ".eE") {
		if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
			if ms < 0 {
				return 0, fmt.Errorf("timestamp must be non-negative, got %s", s)
			}
			if float64(ms) > maxTimestampMs {
				return 0, fmt.Errorf("timestamp %s ms out of range", s)
			}
			return time.Duration(ms) * time.Millisecond, nil
		}
	}
	ms, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid timestamp %q: %w", s, err)
	}
	if ms < 0 {
		return 0, fmt.Errorf("timestamp must be non-negative, got %s", s)
	}
	if ms > maxTimestampMs {
		return 0, fmt.Errorf("timestamp %s ms out of range", s)
	}
	return time.Duration(math.Round(ms * float64(time.Millisecond))), nil
}

// formatMillis writes a Duration as exact decimal milliseconds.
func formatMillis(d time.Duration) string {
	ms, ns := int64(d/time.Millisecond), int64(d%time.Millisecond)
	if ns == 0 {
		return strconv.FormatInt(ms, 10)
	}
	frac := strings.TrimRight(fmt.Sprintf("%06d", ns), "0")
	return strconv.FormatInt(ms, 10) + "." + frac
}

// Write writes reqs as gorgo JSON Lines, one request per line, in the given
// order: timestamp in ms (fractional when Time has sub-millisecond parts),
// session_id, turn (omitted when 0), user_id, model and messages (omitted
// when empty). Every request must have a Session (use DeriveSessions first for
// traces without one) and obey the rules Read enforces, including
// non-decreasing times, so that Read gives the requests back.
func Write(w io.Writer, reqs []Request) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	var prev time.Duration
	for i := range reqs {
		r := &reqs[i]
		if r.Session == "" {
			return fmt.Errorf("writing request %d: empty session (gorgo format requires session_id; derive sessions first)", i+1)
		}
		if err := validate(r); err != nil {
			return fmt.Errorf("writing request %d: %w", i+1, err)
		}
		if r.Time < prev {
			return fmt.Errorf("writing request %d: time %v before the previous request's %v", i+1, r.Time, prev)
		}
		prev = r.Time
		rec := record{
			Timestamp: json.RawMessage(formatMillis(r.Time)),
			SessionID: &r.Session,
			UserID:    r.User,
			Model:     r.Model,
			Tenant:    r.Tenant,
			Priority:  r.Priority,
			HashIDs:   r.HashIDs,
			Messages:  r.Messages,
		}
		in, out := r.InputTokens, r.OutputTokens
		rec.InputLength, rec.OutputLength = &in, &out
		if r.Turn > 0 {
			turn := r.Turn
			rec.Turn = &turn
		}
		if err := enc.Encode(&rec); err != nil {
			return fmt.Errorf("writing request %d: %w", i+1, err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing trace: %w", err)
	}
	return nil
}
