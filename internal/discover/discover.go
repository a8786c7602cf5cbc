// Package discover finds replicas in DNS, as a Kubernetes headless Service publishes them.
//
// A [Group] names one DNS name: its A/AAAA records (dns:) or its SRV
// records (srv:) are the group's replicas. [Resolve] looks a group up
// once; a [Watcher] re-resolves every group on its interval and reports
// each group's endpoint set when it changes. The package knows nothing of
// the proxy: feeding the sets into a fleet is the caller's job.
//
// Concurrency: [Group] and [Endpoint] are plain values. [Resolve] is safe
// for concurrent use when its [Resolver] is (a *net.Resolver is). A
// Watcher's contract is on [Watcher].
package discover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultInterval is how often a group is re-resolved when its interval is
// not set.
const DefaultInterval = 10 * time.Second

// Group is one discovered set of replicas, as written in the config:
//
//	discover:
//	  - dns: vllm-headless.ns.svc.cluster.local    # A/AAAA lookup
//	    port: 8000
//	    ip_family: v4_preferred                    # the default
//	    region: us-ashburn
//	    profile: paper
//	    interval: 10s
//	  - srv: _http._tcp.sglang.ns.svc.cluster.local # SRV: targets and ports from the records
//	    region: eu-frankfurt
type Group struct {
	// DNS is a name whose A and AAAA records are the replicas' addresses
	// (those of one family: see IPFamily).
	DNS string `yaml:"dns"`
	// IPFamily says which of a DNS name's addresses are replicas, as
	// Envoy's dns_lookup_family: v4_preferred (the default: its IPv4
	// addresses, or its IPv6 ones if it has none), v6_preferred, or all.
	// A dual-stack Service lists every pod under both families: taking
	// all would count each pod twice, splitting its load and its cache
	// between two replicas.
	IPFamily string `yaml:"ip_family"`
	// SRV is a name whose SRV records give the replicas' host names and
	// ports. It is looked up as written (no service or proto is added).
	SRV string `yaml:"srv"`
	// Port is the replicas' port, required (1..65535) with DNS; with SRV
	// the ports come from the records and setting Port is an error.
	Port int `yaml:"port"`
	// Scheme is the replicas' URL scheme, http (default) or https.
	Scheme string `yaml:"scheme"`
	// Region and Profile are copied into every endpoint of the group.
	Region  string `yaml:"region"`
	Profile string `yaml:"profile"`
	// Models, Adapters and MaxLoRAs are what every replica of the group
	// serves, for the caller to copy into each one's config (discovery does
	// not use them): see the fleet's replica config.
	Models   []string `yaml:"models"`
	Adapters []string `yaml:"adapters"`
	MaxLoRAs int      `yaml:"max_loras"`
	// Interval is how often the name is re-resolved (default 10s).
	Interval time.Duration `yaml:"interval"`
}

// Endpoint is one discovered replica.
type Endpoint struct {
	// ID is stable as long as the record is: for A/AAAA it is
	// name@ip:port (net.JoinHostPort, so [v6]:port), for SRV
	// name@target:port, with the name and target lower-cased and without a
	// trailing dot. It contains no '/' and so is one URL path segment.
	ID string
	// URL is scheme://ip:port, or scheme://target:port for SRV: the target
	// host name is kept (not resolved to an IP) since it survives pod IP
	// changes and the HTTP client resolves it.
	URL     string
	Region  string
	Profile string
}

// Resolver is the part of *net.Resolver that discovery uses; tests inject
// fakes. A *net.Resolver should have StrictErrors set: without it, Go's
// resolver answers an A+AAAA lookup whose one half timed out or got
// SERVFAIL with the other half's addresses, which would drop replicas on a
// transient failure instead of keeping them.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	LookupSRV(ctx context.Context, service, proto, name string) (cname string, addrs []*net.SRV, err error)
}

var _ Resolver = (*net.Resolver)(nil)

// Name is the group's DNS name, the DNS or SRV one, as written.
func (g Group) Name() string {
	if g.DNS != "" {
		return g.DNS
	}
	return g.SRV
}

// Defaults returns g with its zero Scheme and Interval set to their
// defaults.
func (g Group) Defaults() Group {
	if g.Scheme == "" {
		g.Scheme = "http"
	}
	if g.Interval == 0 {
		g.Interval = DefaultInterval
	}
	if g.IPFamily == "" && g.DNS != "" {
		g.IPFamily = V4Preferred
	}
	return g
}

// The values of Group.IPFamily.
const (
	V4Preferred = "v4_preferred"
	V6Preferred = "v6_preferred"
	AllFamilies = "all"
)

// Validate checks g with its defaults applied: exactly one of dns and srv,
// a valid DNS name, a port in 1..65535 with dns and none with srv, an http
// or https scheme and a positive interval.
func (g Group) Validate() error {
	g = g.Defaults()
	switch {
	case g.DNS == "" && g.SRV == "":
		return errors.New("discover: one of dns and srv is required")
	case g.DNS != "" && g.SRV != "":
		return fmt.Errorf("discover: %s: dns and srv are exclusive", g.DNS)
	}
	name := g.Name()
	if !validName(name) {
		return fmt.Errorf("discover: %q is not a valid DNS name", name)
	}
	if g.DNS != "" && (g.Port < 1 || g.Port > 65535) {
		return fmt.Errorf("discover: %s: port must be in 1..65535, not %d", name, g.Port)
	}
	if g.SRV != "" && g.Port != 0 {
		return fmt.Errorf("discover: %s: port is taken from the SRV records and must not be set", name)
	}
	switch {
	case g.SRV != "" && g.IPFamily != "":
		return fmt.Errorf("discover: %s: ip_family is for dns (SRV targets are host names)", name)
	case g.DNS != "" && g.IPFamily != V4Preferred && g.IPFamily != V6Preferred && g.IPFamily != AllFamilies:
		return fmt.Errorf("discover: %s: ip_family must be %s, %s or %s, not %q", name, V4Preferred, V6Preferred, AllFamilies, g.IPFamily)
	}
	if g.Scheme != "http" && g.Scheme != "https" {
		return fmt.Errorf("discover: %s: scheme must be http or https, not %q", name, g.Scheme)
	}
	if g.Interval <= 0 {
		return fmt.Errorf("discover: %s: interval must be positive, not %v", name, g.Interval)
	}
	return nil
}

// Resolve looks g up once and returns its endpoints sorted by ID, without
// duplicates. A definite "no such host" (net.DNSError.IsNotFound) is not an
// error but an empty set, as is an empty answer: the group has no replicas
// now. Any other lookup failure (timeout, SERVFAIL, no server) is returned
// as an error. SRV priorities and weights are ignored (every record is a
// replica), and so are records with port 0 or the target "." (RFC 2782's
// "no service"). If the resolver returns SRV records along with an error
// (*net.Resolver does so when it dropped malformed records), the records
// are used.
func Resolve(ctx context.Context, r Resolver, g Group) ([]Endpoint, error) {
	g = g.Defaults()
	if err := g.Validate(); err != nil {
		return nil, err
	}
	name := canonical(g.Name())
	var eps []Endpoint
	add := func(hostport string) {
		eps = append(eps, Endpoint{
			ID:      name + "@" + hostport,
			URL:     g.Scheme + "://" + hostport,
			Region:  g.Region,
			Profile: g.Profile,
		})
	}
	if g.DNS != "" {
		addrs, err := r.LookupIPAddr(ctx, g.DNS)
		if err != nil {
			return notFound(err)
		}
		port := strconv.Itoa(g.Port)
		addrs = oneFamily(addrs, g.IPFamily)
		for _, a := range addrs {
			if a.IP == nil || a.IP.IsUnspecified() {
				continue
			}
			// The zone of a link-local address is dropped: a Service
			// never publishes one.
			add(net.JoinHostPort(a.IP.String(), port))
		}
	} else {
		_, srvs, err := r.LookupSRV(ctx, "", "", g.SRV)
		if err != nil && len(srvs) == 0 {
			return notFound(err)
		}
		for _, s := range srvs {
			if s == nil || s.Port == 0 {
				continue
			}
			target := canonical(s.Target)
			if target == "" || !validName(target) {
				continue
			}
			add(net.JoinHostPort(target, strconv.Itoa(int(s.Port))))
		}
	}
	slices.SortFunc(eps, func(a, b Endpoint) int { return strings.Compare(a.ID, b.ID) })
	return slices.CompactFunc(eps, func(a, b Endpoint) bool { return a.ID == b.ID }), nil
}

// oneFamily keeps the addresses of the family asked for (see
// Group.IPFamily): with a preferred family, its addresses if there are
// any, else the others.
func oneFamily(addrs []net.IPAddr, family string) []net.IPAddr {
	if family == AllFamilies {
		return addrs
	}
	v4 := slices.DeleteFunc(slices.Clone(addrs), func(a net.IPAddr) bool { return a.IP.To4() == nil })
	v6 := slices.DeleteFunc(slices.Clone(addrs), func(a net.IPAddr) bool { return a.IP.To4() != nil })
	if family == V6Preferred {
		v4, v6 = v6, v4
	}
	if len(v4) > 0 {
		return v4
	}
	return v6
}

// notFound turns a definite "no such host" into an empty set and passes
// any other error on.
func notFound(err error) ([]Endpoint, error) {
	if dnsErr, ok := errors.AsType[*net.DNSError](err); ok && dnsErr.IsNotFound {
		return nil, nil
	}
	return nil, err
}

// canonical lower-cases a DNS name and drops its trailing dot.
func canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// validName reports whether s is a DNS name in presentation format: at most
// 253 characters (an optional trailing dot aside), labels of 1 to 63
// letters, digits, '-' and '_' ('_' for SRV's _service._proto), none
// starting or ending with '-'.
func validName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range []byte(label) {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
			if !ok {
				return false
			}
		}
	}
	return true
}
