package enginemetrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"
)

// MaxExpositionBytes bounds the body a Scraper reads (8 MiB); a larger
// one is an error. Real engine expositions are tens of kilobytes (well
// under 1 MiB with many LoRA adapters); Parse bounds what it keeps of
// them further.
const MaxExpositionBytes = 8 << 20

// scrapeAccept asks for the classic text format (0.0.4) that
// Parse reads, rather than protobuf or OpenMetrics.
const scrapeAccept = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

// Scraper fetches and parses one replica's engine metrics. It reads no
// clock: the caller bounds a scrape with the context's deadline (or the
// client's timeout) and timestamps the result itself. A Scraper has no
// mutable state and may be used by several goroutines at once.
type Scraper struct {
	// Client makes the request; nil means http.DefaultClient.
	Client *http.Client
	// URL is the full metrics URL, e.g. http://10.0.0.7:30000/metrics.
	URL string
}

// Scrape GETs the metrics URL and parses the body with Parse.
// Every error names the URL: a transport failure (connection refused,
// the context's deadline, ...; errors.Is finds context.DeadlineExceeded
// and context.Canceled), a status other than 200 (with the start of the
// body), a protobuf reply, a body larger than MaxExpositionBytes or cut
// off in transit, or a body that does not parse.
func (s *Scraper) Scrape(ctx context.Context) (Metrics, error) {
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape %s: %w", s.URL, err)
	}
	req.Header.Set("Accept", scrapeAccept)
	resp, err := client.Do(req)
	if err != nil {
		// *url.Error repeats the method and URL; keep its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return Metrics{}, fmt.Errorf("scrape %s: %w", s.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		head, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return Metrics{}, fmt.Errorf("scrape %s: %w", s.URL, &StatusError{Code: resp.StatusCode, Body: printable(head)})
	}
	if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/vnd.google.protobuf") {
		return Metrics{}, fmt.Errorf("scrape %s: protobuf exposition (%s) not supported", s.URL, ct)
	}
	// Parsed as it comes (Parse keeps only the families read): a body cut
	// off in transit, or past MaxExpositionBytes, is a read error rather
	// than a shorter exposition.
	body := &readErr{r: http.MaxBytesReader(nil, resp.Body, MaxExpositionBytes)}
	em, err := Parse(body)
	switch tooBig := (*http.MaxBytesError)(nil); {
	case errors.As(body.err, &tooBig):
		return Metrics{}, fmt.Errorf("scrape %s: body larger than %d bytes", s.URL, MaxExpositionBytes)
	case body.err != nil:
		return Metrics{}, fmt.Errorf("scrape %s: read body: %w", s.URL, body.err)
	case err != nil:
		return Metrics{}, fmt.Errorf("scrape %s: %w", s.URL, err)
	}
	return em, nil
}

// StatusError is a metrics endpoint's reply with a status other than 200.
type StatusError struct {
	// Code is the HTTP status code.
	Code int
	// Body is the start of the reply (up to 256 bytes), for the log.
	Body string
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("HTTP %d %s", e.Code, http.StatusText(e.Code))
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

// printable trims b and keeps it to valid UTF-8 on one line.
func printable(b []byte) string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(b), string(utf8.RuneError)))
	return strings.Join(strings.Fields(s), " ")
}

// readErr remembers the error, other than io.EOF, its reader returned.
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}
