package wire

import (
	"testing"
	"time"
)

func TestRetryWait(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		h    string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"7", 7 * time.Second},
		{"Sat, 05 Dec 2026 10:00:30 GMT", 30 * time.Second},
		{"Sat, 05 Dec 2026 09:00:00 GMT", 0}, // past
		{"-3", 0},
		{"1.5", 0},
		{"soon", 0},
		{"99999999999999999999", 0},
	} {
		if got := RetryWait(c.h, now); got != c.want {
			t.Errorf("RetryWait(%q) = %v, want %v", c.h, got, c.want)
		}
	}
}

func TestNoRoute(t *testing.T) {
	for _, c := range []struct {
		body string
		want bool
	}{
		{`{"detail":"Not Found"}`, true}, // FastAPI: vLLM, SGLang
		{"404 page not found\n", true},   // Go's ServeMux
		{"<html><head><title>404 Not Found</title></head></html>", true},
		{"Not Found", true},
		{"", true},
		{`{"error":{"message":"The model ` + "`m`" + ` does not exist.","type":"NotFoundError","code":404}}`, false},
		{`{"object":"error","message":"Response with id 'resp_1' not found.","code":404}`, false},
		{`{"detail":"Response resp_1 not found"}`, false},
		{`{"detail":"Not Found","message":"adapter a not loaded"}`, false},
		{`{"detail":["Not Found"]}`, false},
		{"no such model", false},
	} {
		if got := NoRoute([]byte(c.body)); got != c.want {
			t.Errorf("NoRoute(%q) = %v, want %v", c.body, got, c.want)
		}
	}
}
