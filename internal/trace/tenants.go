package trace

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gorgo-llm/gorgo/internal/admit"
	"github.com/gorgo-llm/gorgo/internal/tenant"
)

// TenantShare is a tenant, the priority its requests ask for, its share of
// the sessions in a mix of tenants (see AssignTenants), and the TTFT SLO
// its requests are held to (zero: the run's).
type TenantShare struct {
	Name     string
	Priority string
	Share    float64
	SLO      time.Duration
}

// checkTenant says why a tenant's name or priority cannot be.
func checkTenant(name, priority string) error {
	if err := tenant.CheckName(name); err != nil {
		return err
	}
	if priority != "" {
		if _, err := admit.ParsePriority(priority); err != nil {
			return fmt.Errorf("tenant %q: %w", name, err)
		}
	}
	return nil
}

// ParseTenants reads a mix of tenants, "NAME:PRIORITY:SHARE[:SLO],...":
// each tenant with the priority its requests ask for (a name or an
// integer, see admit.ParsePriority; empty: the tenant's default), its share
// of the sessions (relative, non-negative, not all zero; absent: 1) and,
// optionally, the TTFT SLO its requests are held to (a duration, e.g. 1s).
func ParseTenants(s string) ([]TenantShare, error) {
	var out []TenantShare
	err := parseMix("tenants", "NAME:PRIORITY:SHARE[:SLO]", s, func(part string) (string, float64, error) {
		f := strings.Split(part, ":")
		if len(f) > 4 {
			return "", 0, fmt.Errorf("%q has more than four fields", part)
		}
		ts := TenantShare{Name: f[0], Share: 1}
		if len(f) > 1 {
			ts.Priority = f[1]
		}
		if len(f) > 2 {
			w, err := strconv.ParseFloat(f[2], 64)
			if err != nil {
				return "", 0, fmt.Errorf("%s's share %q is not a number", f[0], f[2])
			}
			ts.Share = w
		}
		if len(f) > 3 {
			d, err := time.ParseDuration(f[3])
			if err != nil || d <= 0 {
				return "", 0, fmt.Errorf("%s's TTFT SLO %q is not a positive duration", f[0], f[3])
			}
			ts.SLO = d
		}
		if err := checkTenant(ts.Name, ts.Priority); err != nil {
			return "", 0, err
		}
		out = append(out, ts)
		return ts.Name, ts.Share, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FormatTenants writes a mix as ParseTenants reads it.
func FormatTenants(ts []TenantShare) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.Name + ":" + t.Priority + ":" + strconv.FormatFloat(t.Share, 'g', -1, 64)
		if t.SLO > 0 {
			parts[i] += ":" + t.SLO.String()
		}
	}
	return strings.Join(parts, ",")
}

// tenantSalt keeps the draw of tenants apart from that of models.
const tenantSalt = 0x7e4a47

// AssignTenants gives every request of reqs a tenant, its priority and its
// TTFT SLO, drawn from the mix, in place, as AssignModels does models: one
// draw per session, by the seed and the session's name.
func AssignTenants(reqs []Request, mix []TenantShare, seed uint64) {
	ws := make([]float64, len(mix))
	for i, t := range mix {
		ws[i] = t.Share
	}
	drawBySession(reqs, ws, seed^tenantSalt, func(r *Request, k int) {
		r.Tenant, r.Priority, r.TTFTSLO = mix[k].Name, mix[k].Priority, mix[k].SLO
	})
}

// Tenant keeps only the requests of the named tenant (a tenant's solo
// run), in order.
func Tenant(reqs []Request, name string) []Request {
	var out []Request
	for _, r := range reqs {
		if r.Tenant == name {
			out = append(out, r)
		}
	}
	return out
}
