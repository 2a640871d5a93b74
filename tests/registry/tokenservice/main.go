// tokenservice is a registry token service (the Docker token authentication protocol, as
// Harbor's, a cloud registry's or docker_auth's) for the Distribution registry's `auth:
// token` mode: it signs JWTs with a fresh ES256 key whose JWKS it writes for the registry
// to trust, and grants the scopes asked for to one user (HTTP Basic on GET, as `docker
// login` and crane send it) or to one OAuth2 refresh token (POST, an `identitytoken`).
// Anything else is answered 401. It also fronts the registry at REGISTRY_ADDR (every other
// path is passed to it), as Harbor's core does: clients such as crane accept a token
// service on a private address only on the registry's own host:port. For tests only.
//
//	tokenservice ADDR JWKS_FILE ISSUER SERVICE USER PASSWORD_FILE REFRESH_TOKEN_FILE REGISTRY_ADDR
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

type access struct {
	Type    string   `json:"type"`
	Name    string   `json:"name"`
	Actions []string `json:"actions"`
}

type claims struct {
	jwt.Claims
	Access []access `json:"access"`
}

type service struct {
	signer         jose.Signer
	issuer, name   string
	user, password string
	refreshToken   string
}

func main() {
	if len(os.Args) != 9 {
		fmt.Fprintln(os.Stderr, "usage: tokenservice ADDR JWKS_FILE ISSUER SERVICE USER PASSWORD_FILE REFRESH_TOKEN_FILE REGISTRY_ADDR")
		os.Exit(2)
	}
	s, err := newService(os.Args[2:8])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	http.HandleFunc("/token", s.token)
	http.Handle("/", httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: os.Args[8]}))
	fmt.Fprintln(os.Stderr, http.ListenAndServe(os.Args[1], nil))
	os.Exit(1)
}

// newService makes the key, writes its JWKS and reads the secrets it accepts.
func newService(args []string) (*service, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	const kid = "inplace-test-key"
	jwks, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: &key.PublicKey, KeyID: kid, Algorithm: string(jose.ES256), Use: "sig"},
	}})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(args[0], jwks, 0o644); err != nil {
		return nil, err
	}
	options := (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, options)
	if err != nil {
		return nil, err
	}
	read := func(path string) (string, error) {
		b, err := os.ReadFile(path)
		return strings.TrimSpace(string(b)), err
	}
	s := &service{signer: signer, issuer: args[1], name: args[2], user: args[3]}
	if s.password, err = read(args[4]); err != nil {
		return nil, err
	}
	if len(args) == 6 {
		if s.refreshToken, err = read(args[5]); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func same(a, b string) bool {
	return b != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// token answers a token request: the scopes asked for, to the one user or refresh token.
func (s *service) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	user, password, basic := r.BasicAuth()
	allowed := false
	switch r.Method {
	case http.MethodGet:
		allowed = basic && user == s.user && same(password, s.password)
	case http.MethodPost:
		allowed = r.PostForm.Get("grant_type") == "refresh_token" &&
			same(r.PostForm.Get("refresh_token"), s.refreshToken)
	}
	if !allowed {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintln(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
		return
	}
	now := time.Now()
	c := claims{Claims: jwt.Claims{
		Issuer:    s.issuer,
		Subject:   s.user,
		Audience:  jwt.Audience{s.name},
		Expiry:    jwt.NewNumericDate(now.Add(5 * time.Minute)),
		NotBefore: jwt.NewNumericDate(now),
		IssuedAt:  jwt.NewNumericDate(now),
	}}
	for _, scope := range r.Form["scope"] {
		// repository:NAME:ACTION[,ACTION]; NAME may hold no colon here.
		parts := strings.Split(scope, ":")
		if len(parts) == 3 {
			c.Access = append(c.Access, access{parts[0], parts[1], strings.Split(parts[2], ",")})
		}
	}
	signed, err := jwt.Signed(s.signer).Claims(c).Serialize()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"token": signed, "access_token": signed, "expires_in": 300, "issued_at": now.Format(time.RFC3339),
	})
}
