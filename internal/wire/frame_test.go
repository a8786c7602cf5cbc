package wire

import (
	"strings"
	"testing"
)

func TestNextEvent(t *testing.T) {
	in := "data: {\"a\":1}\n\n: comment\r\ndata: x\r\n\r\n\ndata: [DONE]\n\ndata: part"
	var events []string
	rest := []byte(in)
	for {
		ev, r, ok := NextEvent(rest)
		if !ok {
			break
		}
		events = append(events, string(ev))
		rest = r
	}
	want := []string{"data: {\"a\":1}\n\n", ": comment\r\ndata: x\r\n\r\n", "\ndata: [DONE]\n\n"}
	if strings.Join(events, "|") != strings.Join(want, "|") || string(rest) != "data: part" {
		t.Errorf("events %q, rest %q", events, rest)
	}
	var scratch []byte
	if d := EventData([]byte(events[0]), &scratch); string(d) != `{"a":1}` {
		t.Errorf("data %q", d)
	}
	if d := EventData([]byte(events[1]), &scratch); string(d) != "x" {
		t.Errorf("data %q", d)
	}
	if d := EventData([]byte("data:a\ndata: b\nevent: e\ndata:c\n\n"), &scratch); string(d) != "a\nb\nc" {
		t.Errorf("joined data %q", d)
	}
	if d := EventData([]byte(": only a comment\n\n"), &scratch); d != nil {
		t.Errorf("data of a comment %q", d)
	}
	if !IsDone(EventData([]byte(events[2]), &scratch)) {
		t.Error("[DONE] not recognised")
	}
	if _, _, ok := NextEvent([]byte("\n\n\n")); ok {
		t.Error("blank lines alone are an event")
	}
}

func FuzzNextEvent(f *testing.F) {
	f.Add([]byte("data: a\n\ndata: b\r\n\r\n"))
	f.Fuzz(func(t *testing.T, buf []byte) {
		total := 0
		rest := buf
		for {
			ev, r, ok := NextEvent(rest)
			if !ok {
				break
			}
			if len(ev) == 0 || len(ev)+len(r) != len(rest) {
				t.Fatalf("event %q rest %q of %q", ev, r, rest)
			}
			total += len(ev)
			rest = r
		}
		if total+len(rest) != len(buf) {
			t.Fatal("bytes lost")
		}
	})
}

func TestRequestFault(t *testing.T) {
	for body, want := range map[string]bool{
		`{"object":"error","message":"EngineCore encountered an issue","type":"InternalServerError","param":null,"code":500}`: false,
		`{"error":{"message":"boom","type":"server_error","code":null}}`:                                                      false,
		`{"error":{"message":"busy","code":429}}`:                                                                             false,
		`{"error":"something broke"}`:                                                                                         false,
		`not json`:                                                                                                            false,
		`{"object":"error","message":"This model's maximum context length is 4096","type":"BadRequestError","code":400}`: true,
		`{"error":{"message":"bad","type":"invalid_request_error","code":"context_length_exceeded"}}`:                    true,
		`{"error":{"message":"no such model","code":"404"}}`:                                                             true,
		`{"detail":"x","status":422}`: true,
	} {
		if got := RequestFault([]byte(body)); got != want {
			t.Errorf("RequestFault(%s) = %v, want %v", body, got, want)
		}
	}
}

// An error whose type is not a string still gives its message, nested or
// flat, and a code that blames the request still says so.
func TestErrorWithAnOddType(t *testing.T) {
	for body, want := range map[string]string{
		`{"error":{"message":"bad prompt","type":7,"code":400}}`:           "bad prompt",
		`{"object":"error","message":"bad prompt","type":null,"code":400}`: "bad prompt",
	} {
		if got := ErrorMessage([]byte(body)); got != want {
			t.Errorf("ErrorMessage(%s) = %q, want %q", body, got, want)
		}
		if !RequestFault([]byte(body)) {
			t.Errorf("RequestFault(%s) = false, want true", body)
		}
	}
	if body := `{"error":{"message":["bad","prompt"],"code":400}}`; !RequestFault([]byte(body)) {
		t.Errorf("RequestFault(%s) = false, want true: a message of another kind hid the code", body)
	}
}
