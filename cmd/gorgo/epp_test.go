package main

import (
	"io"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// --body-mode names the modes of a gateway that does not say them on each
// stream; anything else is refused on one line, before the config is read.
func TestBodyModeFlag(t *testing.T) {
	err := runEPP([]string{"--config", "/nonexistent.yaml", "--body-mode", "STREAMED"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--body-mode must be FULL_DUPLEX_STREAMED or BUFFERED") {
		t.Errorf("--body-mode STREAMED: %v", err)
	}
	for mode, want := range map[string][2]filterv3.ProcessingMode_BodySendMode{
		"full_duplex_streamed": {filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		"BUFFERED":             {filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED},
	} {
		pc, err := assumedProtocol(mode)
		if err != nil || pc.GetRequestBodyMode() != want[0] || pc.GetResponseBodyMode() != want[1] {
			t.Errorf("%s: %v, %v", mode, pc, err)
		}
	}
	if pc, err := assumedProtocol(""); pc != nil || err != nil {
		t.Errorf("unset: %v, %v", pc, err)
	}
}
