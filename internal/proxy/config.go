package proxy

import (
	"fmt"
	"time"

	"github.com/gorgo-llm/gorgo/internal/tenant"
)

// Config is the HTTP front end's part of gorgo serve's config file: the
// client listener, its security, and the limits of the request path. Zero
// fields take the defaults Defaults fills in.
type Config struct {
	// Listen is the client listener's address (default 127.0.0.1:8080).
	Listen string `yaml:"listen"`
	// TLS serves clients over TLS.
	TLS TLSConfig `yaml:"tls"`
	// Auth configures client API keys; RateLimit limits request rates.
	Auth      AuthConfig      `yaml:"auth"`
	RateLimit RateLimitConfig `yaml:"rate_limit"`
	// TenantHeader is what the listener does with a client's
	// X-Gorgo-Tenant: "refuse" it with a 400 (the default: a client must
	// not pick its tenant), "ignore" it, or "trust" it (the listener sits
	// behind a gateway that sets it). Otherwise a request's tenant is its
	// API key's name.
	TenantHeader tenant.HeaderRule `yaml:"tenant_header"`
	// EngineOperations is what the listener does with the engines' own
	// operations on their state (SGLang's /flush_cache and /abort_request,
	// vLLM's /reset_prefix_cache, both's loading and unloading of LoRA
	// adapters): "allow" them, sent to every replica (the default, as the
	// engines serve them to their clients), or "refuse" them with a 403 (a
	// fleet shared by tenants: one client's flush, abort of all, sleep or
	// unload would be everyone's; the default where tenants are
	// configured: serve.Config.Defaults).
	EngineOperations string `yaml:"engine_operations"`
	// HeaderTimeout bounds waiting for a stream's response headers
	// (default 30 s): SGLang and vLLM start a stream at once, even for a
	// request they queue, so a replica that sends none is hung, and the
	// request is tried on another. Non-streaming answers have no such limit
	// (their headers come with their last token). Negative means no limit.
	HeaderTimeout time.Duration `yaml:"header_timeout"`
	// FirstByteTimeout bounds waiting for a non-streaming answer (which
	// comes whole, when generation ends; default 5 min; negative: no
	// limit), and a stream's first event after its headers (the request's
	// wait in the engine's queue; StreamIdleTimeout if that is longer): a
	// replica that sends nothing by then is given up on and the request
	// tried elsewhere.
	FirstByteTimeout time.Duration `yaml:"first_byte_timeout"`
	// StreamIdleTimeout cuts an answer whose replica sends nothing for this
	// long once it has begun (default 60 s; negative: never), which frees
	// the client and counts against the replica; a whole answer (held until
	// its end) not done this long after its headers, however its bytes
	// come; and a client that takes no byte of its answer for as long (each
	// write gets it, and a millisecond more per byte written).
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// IdleTimeout closes a client's keep-alive connection idle this long
	// (default 75 s, nginx's); ReadHeaderTimeout cuts a client that takes
	// longer to send its request headers (default 10 s: slowloris).
	// Negative: never (net/http's reading).
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadBodyTimeout cuts a client that takes longer to send its request
	// body (default 60 s; negative: never): a body sent a byte at a time
	// would hold its in-flight slot for ever.
	ReadBodyTimeout time.Duration `yaml:"read_body_timeout"`
	// ShutdownTimeout is how long a shutdown (SIGTERM, SIGINT) lets the
	// requests in flight finish, streams included, while new connections
	// are refused (default 30 s).
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// MaxBodyBytes bounds a request body on every endpoint (default 8 MiB;
	// a larger one is refused with 413, from its Content-Length before it
	// is read when it gives one). MaxAnswerBytes is how much of a
	// non-streaming answer is held before the client gets any of it
	// (default 1 MiB): an answer that fits and breaks off is tried on
	// another replica; a longer one is passed through as it comes, its
	// usage read from its last bytes (wire.PeekTail). (A stream's events are held up to 64 KiB each, to be
	// peeked at; a longer event is passed through unpeeked.)
	MaxBodyBytes   int64 `yaml:"max_body_bytes"`
	MaxAnswerBytes int64 `yaml:"max_answer_bytes"`
	// MaxBodyBytesInFlight bounds the bytes the request bodies being read
	// and served hold at once (default 512 MiB, or four request bodies of
	// max_body_bytes if more; negative: no bound): max_body_bytes ×
	// max_in_flight, 32 GiB by default, is no bound on a machine, and a
	// body's parse takes about three times its size more while it runs.
	// Past it a request is answered 503 with Retry-After at once, its body
	// no further read (httpapi.Budget).
	MaxBodyBytesInFlight int64 `yaml:"max_body_bytes_in_flight"`
	// MaxAnswerBytesInFlight bounds the bytes the whole answers being held
	// hold at once past the first 64 KiB of each (default 256 MiB, or four
	// answers of max_answer_bytes if more; negative: no bound):
	// max_answer_bytes × max_in_flight is 4 GiB by default. An answer the
	// budget cannot hold further is passed through as it comes, as one
	// longer than max_answer_bytes is (its client is served; if it breaks
	// off, it cannot be tried elsewhere), counted in
	// gorgo_answers_unheld_total{limit="max_answer_bytes_in_flight"}.
	MaxAnswerBytesInFlight int64 `yaml:"max_answer_bytes_in_flight"`
	// MaxConnections caps the client connections open at once (default
	// 8192) and MaxInFlight the requests being served (default 4096); past
	// either a client is answered 503 with Retry-After at once. Negative:
	// no cap.
	MaxConnections int `yaml:"max_connections"`
	MaxInFlight    int `yaml:"max_in_flight"`
}

// Defaults returns c with every zero field set to its default.
func (c Config) Defaults() Config {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	c.Auth = c.Auth.defaults()
	if c.EngineOperations == "" {
		c.EngineOperations = OperationsAllow
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 75 * time.Second
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.ReadBodyTimeout == 0 {
		c.ReadBodyTimeout = 60 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 8 << 20
	}
	if c.MaxAnswerBytes == 0 {
		c.MaxAnswerBytes = 1 << 20
	}
	if c.MaxBodyBytesInFlight == 0 {
		c.MaxBodyBytesInFlight = max(512<<20, 4*c.MaxBodyBytes)
	}
	if c.MaxAnswerBytesInFlight == 0 {
		c.MaxAnswerBytesInFlight = max(256<<20, 4*c.MaxAnswerBytes)
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = 8192
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 4096
	}
	if c.FirstByteTimeout == 0 {
		c.FirstByteTimeout = 5 * time.Minute
	}
	if c.HeaderTimeout == 0 {
		c.HeaderTimeout = 30 * time.Second
	}
	if c.StreamIdleTimeout == 0 {
		c.StreamIdleTimeout = 60 * time.Second
	}
	return c
}

// Validate reports the first problem of a defaulted config; it changes
// nothing.
func (c Config) Validate() error {
	if err := c.Auth.validate(); err != nil {
		return err
	}
	if err := c.RateLimit.validate(); err != nil {
		return err
	}
	if err := c.TenantHeader.Check(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if c.EngineOperations != OperationsAllow && c.EngineOperations != OperationsRefuse {
		return fmt.Errorf("config: engine_operations must be %s or %s, not %q", OperationsAllow, OperationsRefuse, c.EngineOperations)
	}
	if c.ShutdownTimeout < 0 {
		return fmt.Errorf("config: shutdown_timeout must not be negative")
	}
	if c.MaxBodyBytes < 1 || c.MaxAnswerBytes < 1 {
		return fmt.Errorf("config: max_body_bytes and max_answer_bytes must be positive")
	}
	if c.MaxBodyBytesInFlight > 0 && c.MaxBodyBytesInFlight <= c.MaxBodyBytes {
		// A body of max_body_bytes is read into max_body_bytes + 1 (to see
		// a longer one): a lone one must fit.
		return fmt.Errorf("config: max_body_bytes_in_flight (%d) must be more than max_body_bytes (%d), or negative for no bound", c.MaxBodyBytesInFlight, c.MaxBodyBytes)
	}
	return nil
}
