package discover

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gopkg.in/yaml.v3"
)

func TestGroupValidate(t *testing.T) {
	long := strings.Repeat("a", 64)
	cases := []struct {
		name string
		g    Group
		err  string // substring; "" means valid
	}{
		{"dns", Group{DNS: "vllm.ns.svc.cluster.local", Port: 8000}, ""},
		{"dns trailing dot", Group{DNS: "vllm.ns.svc.cluster.local.", Port: 1}, ""},
		{"srv", Group{SRV: "_http._tcp.sglang.ns.svc.cluster.local"}, ""},
		{"https", Group{DNS: "a.b", Port: 443, Scheme: "https", Interval: time.Second}, ""},
		{"neither", Group{Port: 80}, "one of dns and srv"},
		{"both", Group{DNS: "a.b", SRV: "_x._tcp.a.b", Port: 80}, "exclusive"},
		{"dns no port", Group{DNS: "a.b"}, "port must be in 1..65535"},
		{"dns port too big", Group{DNS: "a.b", Port: 65536}, "port must be"},
		{"dns negative port", Group{DNS: "a.b", Port: -1}, "port must be"},
		{"srv with port", Group{SRV: "_x._tcp.a.b", Port: 80}, "must not be set"},
		{"bad scheme", Group{DNS: "a.b", Port: 80, Scheme: "ftp"}, "scheme"},
		{"negative interval", Group{DNS: "a.b", Port: 80, Interval: -time.Second}, "interval must be positive"},
		{"slash", Group{DNS: "a/b", Port: 80}, "not a valid DNS name"},
		{"space", Group{DNS: "a b", Port: 80}, "not a valid DNS name"},
		{"url", Group{DNS: "http://a.b", Port: 80}, "not a valid DNS name"},
		{"empty label", Group{DNS: "a..b", Port: 80}, "not a valid DNS name"},
		{"leading hyphen", Group{DNS: "-a.b", Port: 80}, "not a valid DNS name"},
		{"long label", Group{DNS: long + ".b", Port: 80}, "not a valid DNS name"},
		{"long name", Group{DNS: strings.Repeat("abc.", 64) + "d", Port: 80}, "not a valid DNS name"},
		{"only dot", Group{DNS: ".", Port: 80}, "not a valid DNS name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.g.Validate()
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, c.err)
			}
		})
	}
}

func TestGroupDefaults(t *testing.T) {
	g := Group{DNS: "a.b", Port: 80}.Defaults()
	if g.Scheme != "http" || g.Interval != DefaultInterval {
		t.Fatalf("Defaults() = %+v", g)
	}
	g = Group{DNS: "a.b", Port: 80, Scheme: "https", Interval: time.Second}.Defaults()
	if g.Scheme != "https" || g.Interval != time.Second {
		t.Fatalf("Defaults() overrode set fields: %+v", g)
	}
}

func TestGroupYAML(t *testing.T) {
	const doc = `
discover:
  - dns: vllm-headless.ns.svc.cluster.local   # A/AAAA lookup
    port: 8000
    region: us-ashburn
    profile: paper
    interval: 10s
  - srv: _http._tcp.sglang.ns.svc.cluster.local  # SRV lookup
    region: eu-frankfurt
    interval: 1m30s
`
	var cfg struct {
		Discover []Group `yaml:"discover"`
	}
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	want := []Group{
		{DNS: "vllm-headless.ns.svc.cluster.local", Port: 8000, Region: "us-ashburn", Profile: "paper", Interval: 10 * time.Second},
		{SRV: "_http._tcp.sglang.ns.svc.cluster.local", Region: "eu-frankfurt", Interval: 90 * time.Second},
	}
	if !reflect.DeepEqual(cfg.Discover, want) {
		t.Fatalf("decoded %+v, want %+v", cfg.Discover, want)
	}
	for _, g := range cfg.Discover {
		if err := g.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	// A bare number is not a duration.
	if err := yaml.Unmarshal([]byte("interval: 10\n"), &Group{}); err == nil {
		t.Fatal("interval: 10 decoded without error")
	}
}

// fakeResolver answers from maps the test changes and counts lookups per
// name. A lookup reads the maps under the same lock that counts it, so a
// lookup counted after a change sees the change.
type fakeResolver struct {
	mu    sync.Mutex
	ips   map[string][]net.IPAddr
	srvs  map[string][]*net.SRV
	errs  map[string]error
	calls map[string]int
}

func newFake() *fakeResolver {
	return &fakeResolver{ips: map[string][]net.IPAddr{}, srvs: map[string][]*net.SRV{}, errs: map[string]error{}, calls: map[string]int{}}
}

func (f *fakeResolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[host]++
	return slices.Clone(f.ips[host]), f.errs[host]
}

func (f *fakeResolver) LookupSRV(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
	if service != "" || proto != "" {
		return "", nil, fmt.Errorf("unexpected service %q proto %q", service, proto)
	}
	return name, slices.Clone(f.srvs[name]), f.errs[name]
}

func (f *fakeResolver) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

func (f *fakeResolver) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

// step waits until a lookup of name that started after the call has been
// fully handled: the watcher handles a lookup (and calls onChange) before
// it starts the next one, so two more lookups suffice.
func (f *fakeResolver) step(t *testing.T, name string) {
	t.Helper()
	n := f.count(name)
	waitFor(t, fmt.Sprintf("two more lookups of %s", name), func() bool { return f.count(name) >= n+2 })
}

func ips(ss ...string) []net.IPAddr {
	var out []net.IPAddr
	for _, s := range ss {
		out = append(out, net.IPAddr{IP: net.ParseIP(s)})
	}
	return out
}

var (
	errNotFound  = &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}
	errTimeout   = &net.DNSError{Err: "i/o timeout", Name: "x", IsTimeout: true, IsTemporary: true}
	errServFail  = &net.DNSError{Err: "server misbehaving", Name: "x", IsTemporary: true}
	errMalformed = &net.DNSError{Err: "DNS response contained records which contain invalid names", Name: "x"}
)

func ids(eps []Endpoint) []string {
	out := []string{}
	for _, e := range eps {
		out = append(out, e.ID)
	}
	return out
}

func TestResolve(t *testing.T) {
	f := newFake()
	f.ips["V.ns.svc."] = ips("10.0.0.2", "10.0.0.1", "fd00::1", "10.0.0.1", "::ffff:10.0.0.3")
	f.ips["six.ns.svc"] = ips("fd00::2", "fd00::1")
	f.ips["gone.ns.svc"] = nil
	f.errs["gone.ns.svc"] = errNotFound
	f.errs["flaky.ns.svc"] = errServFail
	f.ips["empty.ns.svc"] = nil
	f.srvs["_http._tcp.s.ns.svc"] = []*net.SRV{
		{Target: "S-1.s.ns.svc.", Port: 30000, Priority: 10},
		{Target: "s-0.s.ns.svc.", Port: 30000},
		{Target: "s-1.s.ns.svc.", Port: 30000, Priority: 1}, // duplicate of S-1 (case)
		{Target: ".", Port: 30000},                          // "no service"
		{Target: "s-2.s.ns.svc.", Port: 0},
		{Target: "bad/host.", Port: 1},
	}
	f.srvs["_http._tcp.partial.ns.svc"] = []*net.SRV{{Target: "p-0.partial.ns.svc.", Port: 80}}
	f.errs["_http._tcp.partial.ns.svc"] = errMalformed
	f.errs["_http._tcp.none.ns.svc"] = errNotFound

	cases := []struct {
		name string
		g    Group
		want []Endpoint
		err  bool
	}{
		// The name is looked up as written; the id uses its canonical form.
		{"a and aaaa", Group{DNS: "V.ns.svc.", Port: 8000, Region: "r", Profile: "p", IPFamily: AllFamilies}, []Endpoint{
			{ID: "v.ns.svc@10.0.0.1:8000", URL: "http://10.0.0.1:8000", Region: "r", Profile: "p"},
			{ID: "v.ns.svc@10.0.0.2:8000", URL: "http://10.0.0.2:8000", Region: "r", Profile: "p"},
			{ID: "v.ns.svc@10.0.0.3:8000", URL: "http://10.0.0.3:8000", Region: "r", Profile: "p"},
			{ID: "v.ns.svc@[fd00::1]:8000", URL: "http://[fd00::1]:8000", Region: "r", Profile: "p"},
		}, false},
		// A dual-stack name lists each pod under both families: by default
		// its IPv4 addresses alone are replicas, or its IPv6 ones without.
		{"v4 preferred", Group{DNS: "V.ns.svc.", Port: 8000}, []Endpoint{
			{ID: "v.ns.svc@10.0.0.1:8000", URL: "http://10.0.0.1:8000"},
			{ID: "v.ns.svc@10.0.0.2:8000", URL: "http://10.0.0.2:8000"},
			{ID: "v.ns.svc@10.0.0.3:8000", URL: "http://10.0.0.3:8000"},
		}, false},
		{"v6 preferred", Group{DNS: "V.ns.svc.", Port: 8000, IPFamily: V6Preferred}, []Endpoint{
			{ID: "v.ns.svc@[fd00::1]:8000", URL: "http://[fd00::1]:8000"},
		}, false},
		{"v4 preferred, v6 only", Group{DNS: "six.ns.svc", Port: 8000}, []Endpoint{
			{ID: "six.ns.svc@[fd00::1]:8000", URL: "http://[fd00::1]:8000"},
			{ID: "six.ns.svc@[fd00::2]:8000", URL: "http://[fd00::2]:8000"},
		}, false},
		{"bad family", Group{DNS: "V.ns.svc.", Port: 8000, IPFamily: "ipv5"}, nil, true},
		{"family with srv", Group{SRV: "_http._tcp.s.ns.svc", IPFamily: AllFamilies}, nil, true},
		{"srv", Group{SRV: "_http._tcp.s.ns.svc", Scheme: "https", Region: "eu"}, []Endpoint{
			{ID: "_http._tcp.s.ns.svc@s-0.s.ns.svc:30000", URL: "https://s-0.s.ns.svc:30000", Region: "eu"},
			{ID: "_http._tcp.s.ns.svc@s-1.s.ns.svc:30000", URL: "https://s-1.s.ns.svc:30000", Region: "eu"},
		}, false},
		{"srv partial", Group{SRV: "_http._tcp.partial.ns.svc"}, []Endpoint{
			{ID: "_http._tcp.partial.ns.svc@p-0.partial.ns.svc:80", URL: "http://p-0.partial.ns.svc:80"},
		}, false},
		{"not found", Group{DNS: "gone.ns.svc", Port: 1}, nil, false},
		{"empty", Group{DNS: "empty.ns.svc", Port: 1}, nil, false},
		{"srv not found", Group{SRV: "_http._tcp.none.ns.svc"}, nil, false},
		{"transient", Group{DNS: "flaky.ns.svc", Port: 1}, nil, true},
		{"invalid", Group{DNS: "a/b", Port: 1}, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Resolve(context.Background(), f, c.g)
			if (err != nil) != c.err {
				t.Fatalf("Resolve() error = %v, want error %v", err, c.err)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("Resolve() = %+v\nwant %+v", got, c.want)
			}
			for _, e := range got {
				if strings.Contains(e.ID, "/") {
					t.Errorf("id %q has a '/'", e.ID)
				}
				if u, err := url.Parse(e.URL); err != nil || u.Host == "" {
					t.Errorf("URL %q: %v", e.URL, err)
				}
				if seg, err := url.PathUnescape(url.PathEscape(e.ID)); err != nil || seg != e.ID {
					t.Errorf("id %q does not round-trip as a path segment", e.ID)
				}
			}
		})
	}
}

// recorder keeps a watcher's onChange calls.
type recorder struct {
	mu    sync.Mutex
	calls []change
}

type change struct {
	group int
	ids   []string
}

func (r *recorder) onChange(group int, eps []Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, change{group, ids(eps)})
}

// of returns the id sets group was reported with, in order.
func (r *recorder) of(group int) [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out [][]string
	for _, c := range r.calls {
		if c.group == group {
			out = append(out, c.ids)
		}
	}
	return out
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

// waitFor polls cond for up to 20 s: the tests run on a loaded machine, so
// they wait for conditions rather than for times.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// run starts w and returns a function that stops it and waits for Run.
func run(t *testing.T, w *Watcher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run() = %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	t.Cleanup(stop)
	return stop
}

func TestWatcherFake(t *testing.T) {
	const name, srvName = "v.ns.svc", "_http._tcp.s.ns.svc"
	f := newFake()
	f.errs[name] = errTimeout // fails before its first answer
	f.srvs[srvName] = []*net.SRV{{Target: "s-0.s.ns.svc.", Port: 30000}}
	var rec recorder
	var logs syncBuffer
	w, err := NewWatcher([]Group{
		{DNS: name, Port: 8000, Interval: time.Millisecond},
		{SRV: srvName, Interval: time.Millisecond},
	}, f, rec.onChange, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if f.count(name) != 0 {
		t.Fatal("NewWatcher looked up")
	}
	run(t, w)
	const a, b, c = "v.ns.svc@10.0.0.1:8000", "v.ns.svc@10.0.0.2:8000", "v.ns.svc@10.0.0.3:8000"
	check := func(what string, want ...[]string) {
		t.Helper()
		if got := rec.of(0); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("%s: group 0 reported %q, want %q", what, got, want)
		}
	}

	// Failures before the first answer: nothing reported, logged once.
	f.step(t, name)
	f.step(t, name)
	check("failing from the start")
	if n := logs.count("lookup failed"); n != 1 {
		t.Fatalf("%d failure logs, want 1", n)
	}
	f.set(func() { delete(f.errs, name); f.ips[name] = ips("10.0.0.2", "10.0.0.1") })
	f.step(t, name)
	check("first answer", []string{a, b})

	// No change: no call.
	f.step(t, name)
	f.step(t, name)
	check("no change", []string{a, b})

	// Scale up, then down.
	f.set(func() { f.ips[name] = ips("10.0.0.1", "10.0.0.2", "10.0.0.3") })
	f.step(t, name)
	f.set(func() { f.ips[name] = ips("10.0.0.3") })
	f.step(t, name)
	check("scale up and down", []string{a, b}, []string{a, b, c}, []string{c})

	// Transient failures keep the set, are logged once per streak.
	for _, e := range []error{errTimeout, errServFail} {
		f.set(func() { f.errs[name] = e; f.ips[name] = nil })
		f.step(t, name)
		f.step(t, name)
	}
	check("transient", []string{a, b}, []string{a, b, c}, []string{c})
	if n := logs.count("lookup failed"); n != 2 {
		t.Fatalf("%d failure logs after two streaks, want 2", n)
	}
	// Recovery with the same set: no call.
	f.set(func() { delete(f.errs, name); f.ips[name] = ips("10.0.0.3") })
	f.step(t, name)
	check("recovered", []string{a, b}, []string{a, b, c}, []string{c})
	if n := logs.count("lookup recovered"); n != 2 {
		t.Fatalf("%d recovery logs, want 2", n)
	}

	// No such host: scale to zero, reported once.
	f.set(func() { f.errs[name] = errNotFound })
	f.step(t, name)
	f.step(t, name)
	check("not found", []string{a, b}, []string{a, b, c}, []string{c}, []string{})
	// Back, then a successful empty answer.
	f.set(func() { delete(f.errs, name); f.ips[name] = ips("10.0.0.1") })
	f.step(t, name)
	f.set(func() { f.ips[name] = nil })
	f.step(t, name)
	check("empty answer", []string{a, b}, []string{a, b, c}, []string{c}, []string{}, []string{a}, []string{})
	if n := logs.count("no endpoints"); n != 2 {
		t.Fatalf("%d scale-to-zero logs, want 2", n)
	}

	// The SRV group was reported once, under its own index.
	f.step(t, srvName)
	if got, want := rec.of(1), [][]string{{srvName + "@s-0.s.ns.svc:30000"}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("group 1 reported %q, want %q", got, want)
	}
}

func TestWatcherEmptyFirstAnswer(t *testing.T) {
	f := newFake()
	f.errs["z.ns.svc"] = errNotFound
	var rec recorder
	w, err := NewWatcher([]Group{{DNS: "z.ns.svc", Port: 1, Interval: time.Millisecond}}, f, rec.onChange, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	f.step(t, "z.ns.svc")
	f.step(t, "z.ns.svc")
	if got := rec.of(0); !slices.EqualFunc(got, [][]string{{}}, slices.Equal) {
		t.Fatalf("reported %q, want one empty set", got)
	}
}

// deadlineResolver records the time each lookup is given.
type deadlineResolver struct {
	*fakeResolver
	given chan time.Duration
}

func (d *deadlineResolver) LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error) {
	if dl, ok := ctx.Deadline(); ok {
		select {
		case d.given <- time.Until(dl):
		default:
		}
	}
	return ips("127.0.0.1"), nil
}

// A lookup has time for Go's resolver to ask a second nameserver after
// the first's 5 s timeout, however short the group's interval.
func TestLookupOutlastsOneDeadNameserver(t *testing.T) {
	d := &deadlineResolver{fakeResolver: newFake(), given: make(chan time.Duration, 1)}
	w, err := NewWatcher([]Group{{DNS: "a.b", Port: 1, Interval: time.Second}}, d, func(int, []Endpoint) {}, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	if got := <-d.given; got < 10*time.Second {
		t.Errorf("a lookup given %v: a dead first nameserver takes 5 s of it", got)
	}
}

func TestWatcherLifecycle(t *testing.T) {
	if _, err := NewWatcher([]Group{{DNS: "a.b"}}, nil, func(int, []Endpoint) {}, nil); err == nil {
		t.Fatal("NewWatcher accepted a group without a port")
	}
	if _, err := NewWatcher(nil, nil, nil, nil); err == nil {
		t.Fatal("NewWatcher accepted a nil onChange")
	}
	f := newFake()
	f.ips["a.b"] = ips("127.0.0.1")
	var rec recorder
	w, err := NewWatcher([]Group{{DNS: "a.b", Port: 1, Interval: time.Millisecond}}, f, rec.onChange, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, w)
	waitFor(t, "the first answer", func() bool { return len(rec.of(0)) == 1 })
	if err := w.Run(context.Background()); err == nil {
		t.Fatal("second Run succeeded")
	}
	stop()
	// After Run returned, nothing more is looked up or reported.
	n := f.count("a.b")
	f.set(func() { f.ips["a.b"] = ips("127.0.0.2") })
	time.Sleep(20 * time.Millisecond)
	if f.count("a.b") != n || len(rec.of(0)) != 1 {
		t.Fatal("the watcher went on after Run returned")
	}
}

// dnsServer is a tiny authoritative UDP DNS server answering A, AAAA and
// SRV queries from maps the test changes. Unknown names get NXDOMAIN,
// known names without records of the asked type an empty answer, names in
// servfail SERVFAIL.
type dnsServer struct {
	pc       net.PacketConn
	mu       sync.Mutex
	addrs    map[string][]netip.Addr // fully qualified, lower-case
	srvs     map[string][]net.SRV
	servfail map[string]bool
	queries  map[string]int
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{pc: pc, addrs: map[string][]netip.Addr{}, srvs: map[string][]net.SRV{}, servfail: map[string]bool{}, queries: map[string]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			if resp, err := s.answer(buf[:n]); err != nil {
				t.Errorf("dns server: %v", err)
			} else {
				pc.WriteTo(resp, from)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return s
}

// resolver returns a strict Go resolver that sends every query to s.
func (s *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, StrictErrors: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.pc.LocalAddr().String())
	}}
}

func (s *dnsServer) set(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn()
}

func (s *dnsServer) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[name]
}

func (s *dnsServer) answer(req []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	name := strings.ToLower(q.Name.String())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queries[name]++
	addrs, hasAddrs := s.addrs[name]
	srvs, hasSRVs := s.srvs[name]
	rcode := dnsmessage.RCodeSuccess
	switch {
	case s.servfail[name]:
		rcode = dnsmessage.RCodeServerFailure
	case !hasAddrs && !hasSRVs:
		rcode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID: h.ID, Response: true, Authoritative: true,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode,
	})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}
	for _, a := range addrs {
		switch {
		case q.Type == dnsmessage.TypeA && a.Is4():
			err = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
		case q.Type == dnsmessage.TypeAAAA && a.Is6():
			err = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
		if err != nil {
			return nil, err
		}
	}
	for _, r := range srvs {
		if q.Type != dnsmessage.TypeSRV {
			break
		}
		target, err := dnsmessage.NewName(r.Target)
		if err != nil {
			return nil, err
		}
		if err := b.SRVResource(rh, dnsmessage.SRVResource{Priority: r.Priority, Weight: r.Weight, Port: r.Port, Target: target}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

func TestEndToEndDNS(t *testing.T) {
	const vllm, sglang = "vllm.ns.svc.test.", "_http._tcp.sglang.ns.svc.test."
	s := startDNS(t)
	v6 := netip.MustParseAddr("2001:db8::1")
	a1, a2, a3 := netip.MustParseAddr("127.0.1.1"), netip.MustParseAddr("127.0.1.2"), netip.MustParseAddr("127.0.1.3")
	pod := func(i int) net.SRV {
		return net.SRV{Target: fmt.Sprintf("sglang-%d.sglang.ns.svc.test.", i), Port: 30000, Weight: 1}
	}
	s.set(func() {
		s.addrs[vllm] = []netip.Addr{a1, v6, a2}
		s.srvs[sglang] = []net.SRV{pod(1), pod(0)}
	})

	var rec recorder
	var got sync.Map // group -> latest []Endpoint
	onChange := func(g int, eps []Endpoint) { got.Store(g, eps); rec.onChange(g, eps) }
	w, err := NewWatcher([]Group{
		{DNS: "vllm.ns.svc.test", Port: 8000, Region: "us-ashburn", Profile: "paper", Interval: 20 * time.Millisecond, IPFamily: AllFamilies},
		{SRV: "_http._tcp.sglang.ns.svc.test", Region: "eu-frankfurt", Interval: 20 * time.Millisecond},
	}, s.resolver(), onChange, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)

	vid := func(hostport string) string { return "vllm.ns.svc.test@" + hostport }
	sid := func(i int) string {
		return fmt.Sprintf("_http._tcp.sglang.ns.svc.test@sglang-%d.sglang.ns.svc.test:30000", i)
	}
	wait := func(group int, want ...string) {
		t.Helper()
		waitFor(t, fmt.Sprintf("group %d = %q", group, want), func() bool {
			r := rec.of(group)
			return len(r) > 0 && slices.Equal(r[len(r)-1], want)
		})
	}

	// Initial sets.
	wait(0, vid("127.0.1.1:8000"), vid("127.0.1.2:8000"), vid("[2001:db8::1]:8000"))
	wait(1, sid(0), sid(1))
	v, _ := got.Load(0)
	if e := v.([]Endpoint)[2]; e.URL != "http://[2001:db8::1]:8000" || e.Region != "us-ashburn" || e.Profile != "paper" {
		t.Fatalf("endpoint %+v", e)
	}
	v, _ = got.Load(1)
	if e := v.([]Endpoint)[0]; e.URL != "http://sglang-0.sglang.ns.svc.test:30000" || e.Region != "eu-frankfurt" {
		t.Fatalf("endpoint %+v", e)
	}

	// Scale up, then down (v4 only, so that a lookup never sees half a change).
	s.set(func() { s.addrs[vllm] = []netip.Addr{a1, v6, a2, a3} })
	wait(0, vid("127.0.1.1:8000"), vid("127.0.1.2:8000"), vid("127.0.1.3:8000"), vid("[2001:db8::1]:8000"))
	s.set(func() { s.addrs[vllm] = []netip.Addr{v6, a3} })
	wait(0, vid("127.0.1.3:8000"), vid("[2001:db8::1]:8000"))

	// SRV: a pod added, one removed.
	s.set(func() { s.srvs[sglang] = []net.SRV{pod(1), pod(2)} })
	wait(1, sid(1), sid(2))

	// SERVFAIL keeps the set.
	s.set(func() { s.servfail[vllm] = true })
	n := s.count(vllm)
	waitFor(t, "more queries", func() bool { return s.count(vllm) >= n+6 })
	if r := rec.of(0); len(r) != 3 {
		t.Fatalf("group 0 reported %q during SERVFAIL", r)
	}

	// NXDOMAIN empties it (scaled to zero / Service deleted).
	s.set(func() { s.servfail[vllm] = false; delete(s.addrs, vllm) })
	wait(0)
	s.set(func() { delete(s.srvs, sglang) })
	wait(1)

	want0 := [][]string{
		{vid("127.0.1.1:8000"), vid("127.0.1.2:8000"), vid("[2001:db8::1]:8000")},
		{vid("127.0.1.1:8000"), vid("127.0.1.2:8000"), vid("127.0.1.3:8000"), vid("[2001:db8::1]:8000")},
		{vid("127.0.1.3:8000"), vid("[2001:db8::1]:8000")},
		{},
	}
	if r := rec.of(0); !slices.EqualFunc(r, want0, slices.Equal) {
		t.Fatalf("group 0 reported %q\nwant %q", r, want0)
	}
	want1 := [][]string{{sid(0), sid(1)}, {sid(1), sid(2)}, {}}
	if r := rec.of(1); !slices.EqualFunc(r, want1, slices.Equal) {
		t.Fatalf("group 1 reported %q\nwant %q", r, want1)
	}
}
