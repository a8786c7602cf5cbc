package httpapi

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"

	"github.com/gorgo-llm/gorgo/internal/yamlfile"
)

// MinTokenLen is the shortest secret accepted.
const MinTokenLen = 16

// Token is a bearer secret and the name the log gives its holder.
type Token struct{ Name, Secret string }

// ReadTokens reads a file of secrets, one per line, each "SECRET" or "NAME
// SECRET" (a name for the logs; else FILE:LINE); blank lines and lines
// starting with # are skipped. Every secret is at least MinTokenLen
// characters, and the file holds at least one. what names the setting,
// for errors.
func ReadTokens(path, what string) ([]Token, error) {
	data, err := yamlfile.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", what, err)
	}
	var out []Token
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch len(f) {
		case 1:
			out = append(out, Token{Name: fmt.Sprintf("%s:%d", path, n), Secret: f[0]})
		case 2:
			out = append(out, Token{Name: f[0], Secret: f[1]})
		default:
			return nil, fmt.Errorf("config: %s %s:%d: want SECRET or NAME SECRET", what, path, n)
		}
		if len(out[len(out)-1].Secret) < MinTokenLen {
			return nil, fmt.Errorf("config: %s %s:%d: a secret must be at least %d characters", what, path, n, MinTokenLen)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("config: %s %s holds no secret", what, path)
	}
	return out, nil
}

// Match returns the name of the token the request's bearer credential is,
// comparing in constant time against every token; "" if none. The scheme's
// name is read whatever its case, as RFC 9110 has it ("bearer KEY" was a
// 401).
func Match(r *http.Request, toks []Token) string {
	scheme, given, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	ok = ok && strings.EqualFold(scheme, "Bearer")
	given = strings.TrimLeft(given, " ")
	name := ""
	for _, t := range toks {
		if ok && subtle.ConstantTimeCompare([]byte(given), []byte(t.Secret)) == 1 {
			name = t.Name
		}
	}
	return name
}
