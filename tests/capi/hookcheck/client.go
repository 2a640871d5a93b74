package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
)

// Cluster API waits this long for a discovery answer.
const discoveryTimeout = 10 * time.Second

// registration is one handler as Cluster API keeps it after discovery.
type registration struct {
	name          string
	gvh           runtimecatalog.GroupVersionHook
	timeout       time.Duration
	failurePolicy runtimehooksv1.FailurePolicy
}

// runtimeClient behaves as Cluster API's runtime client towards one ExtensionConfig
// (clientConfig.url, verified against clientConfig.caBundle): discovery first, then calls
// to the registered handlers.
type runtimeClient struct {
	base     *url.URL
	http     *http.Client
	catalog  *runtimecatalog.Catalog
	handlers map[runtimecatalog.GroupVersionHook]registration
	// record receives every exchange, for the golden files.
	record func(name string, request, response runtime.Object)
}

func newRuntimeClient(config *runtimev1.ExtensionConfig) (*runtimeClient, error) {
	clientConfig := config.Spec.ClientConfig
	base, err := url.Parse(clientConfig.URL)
	if err != nil {
		return nil, err
	}
	if base.Scheme != "https" {
		return nil, fmt.Errorf("extension URL %s: Cluster API calls extensions over https only", clientConfig.URL)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(clientConfig.CABundle) {
		return nil, errors.New("caBundle holds no PEM certificate")
	}
	catalog := runtimecatalog.New()
	if err := runtimehooksv1.AddToCatalog(catalog); err != nil {
		return nil, err
	}
	client := &http.Client{
		Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs:    roots,
			ServerName: base.Hostname(),
			MinVersion: tls.VersionTLS12,
		}},
		// Cluster API never follows a redirect: the answer must come from the registered URL.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &runtimeClient{
		base:     base,
		http:     client,
		catalog:  catalog,
		handlers: map[runtimecatalog.GroupVersionHook]registration{},
		record:   func(string, runtime.Object, runtime.Object) {},
	}, nil
}

func (c *runtimeClient) gvh(hook runtimecatalog.Hook) runtimecatalog.GroupVersionHook {
	gvh, err := c.catalog.GroupVersionHook(hook)
	if err != nil {
		panic(err) // the hooks used here are all in the catalog
	}
	return gvh
}

// discover asks the extension for its handlers and registers them, refusing an answer
// Cluster API would refuse.
func (c *runtimeClient) discover(ctx context.Context) error {
	gvh := c.gvh(runtimehooksv1.Discovery)
	request := &runtimehooksv1.DiscoveryRequest{}
	response := &runtimehooksv1.DiscoveryResponse{}
	if err := c.post(ctx, gvh, "", discoveryTimeout, request, response); err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	c.record("discovery", request, response)
	if response.Status != runtimehooksv1.ResponseStatusSuccess {
		return fmt.Errorf("discovery answered %q: %s", response.Status, response.Message)
	}
	var problems []error
	seen := map[string]bool{}
	for _, handler := range response.Handlers {
		reg, err := c.validateHandler(handler, seen)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		if _, twice := c.handlers[reg.gvh]; twice {
			// Cluster API supports exactly one in-place extension handler per hook.
			problems = append(problems, fmt.Errorf("two handlers for hook %s", reg.gvh))
		}
		c.handlers[reg.gvh] = reg
	}
	return errors.Join(problems...)
}

// validateHandler applies Cluster API's defaults (Fail, 10s) and checks.
func (c *runtimeClient) validateHandler(handler runtimehooksv1.ExtensionHandler, seen map[string]bool) (registration, error) {
	var problems []error
	if seen[handler.Name] {
		problems = append(problems, fmt.Errorf("duplicate handler name %s", handler.Name))
	}
	seen[handler.Name] = true
	if errs := validation.IsDNS1123Label(handler.Name); len(errs) > 0 {
		problems = append(problems, fmt.Errorf("handler name %q is not a DNS-1123 label: %v", handler.Name, errs))
	}
	timeout := int32(runtimehooksv1.DefaultHandlersTimeoutSeconds)
	if handler.TimeoutSeconds != nil {
		timeout = *handler.TimeoutSeconds
	}
	if timeout < 0 || timeout > 30 {
		problems = append(problems, fmt.Errorf("handler %s timeoutSeconds %d is not within 0..30", handler.Name, timeout))
	}
	policy := runtimehooksv1.FailurePolicyFail
	if handler.FailurePolicy != nil {
		policy = *handler.FailurePolicy
	}
	if policy != runtimehooksv1.FailurePolicyFail && policy != runtimehooksv1.FailurePolicyIgnore {
		problems = append(problems, fmt.Errorf("handler %s failurePolicy %q is neither Fail nor Ignore", handler.Name, policy))
	}
	gv, err := schema.ParseGroupVersion(handler.RequestHook.APIVersion)
	gvh := runtimecatalog.GroupVersionHook{Group: gv.Group, Version: gv.Version, Hook: handler.RequestHook.Hook}
	if err != nil || !c.catalog.IsHookRegistered(gvh) {
		problems = append(problems, fmt.Errorf("handler %s requestHook %s/%s is not in the Runtime SDK catalog", handler.Name, handler.RequestHook.APIVersion, handler.RequestHook.Hook))
	}
	reg := registration{name: handler.Name, gvh: gvh, failurePolicy: policy}
	// Zero means "no limit of its own": Cluster API then uses its default.
	reg.timeout = time.Duration(runtimehooksv1.DefaultHandlersTimeoutSeconds) * time.Second
	if timeout > 0 {
		reg.timeout = time.Duration(timeout) * time.Second
	}
	return reg, errors.Join(problems...)
}

// call sends a hook request to the one handler registered for the hook and decodes the
// answer into the hook's response type; a Failure answer is an error, as for Cluster API.
func (c *runtimeClient) call(ctx context.Context, caseName string, hook runtimecatalog.Hook, request runtimehooksv1.RequestObject, response runtimehooksv1.ResponseObject) error {
	gvh := c.gvh(hook)
	if err := c.catalog.ValidateRequest(gvh, request); err != nil {
		return err
	}
	if err := c.catalog.ValidateResponse(gvh, response); err != nil {
		return err
	}
	reg, ok := c.handlers[gvh]
	if !ok {
		return fmt.Errorf("discovery registered no handler for %s", gvh)
	}
	if request.GetSettings() == nil {
		request.SetSettings(map[string]string{})
	}
	if err := c.post(ctx, gvh, reg.name, reg.timeout, request, response); err != nil {
		return fmt.Errorf("%s handler %s: %w", gvh.Hook, reg.name, err)
	}
	c.record(caseName, request, response)
	if response.GetStatus() != runtimehooksv1.ResponseStatusSuccess {
		return fmt.Errorf("%s handler %s answered %q: %s", gvh.Hook, reg.name, response.GetStatus(), response.GetMessage())
	}
	return nil
}

// post is one HTTP exchange: the request's GVK from the catalog, POST to GVHToPath with
// ?timeout=, HTTP 200 only, and a response that decodes into the hook's type with no field
// Cluster API does not know and the kind the catalog names.
func (c *runtimeClient) post(ctx context.Context, gvh runtimecatalog.GroupVersionHook, name string, timeout time.Duration, request, response runtime.Object) error {
	requestGVK, err := c.catalog.Request(gvh)
	if err != nil {
		return err
	}
	request.GetObjectKind().SetGroupVersionKind(requestGVK)
	body, err := json.Marshal(request)
	if err != nil {
		return err
	}
	target := *c.base
	target.Path = path.Join(target.Path, runtimecatalog.GVHToPath(gvh, name))
	query := target.Query()
	query.Add("timeout", timeout.String())
	target.RawQuery = query.Encode()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	httpRequest, err := http.NewRequestWithContext(ctx, http.MethodPost, target.String(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	answer, err := c.http.Do(httpRequest)
	if err != nil {
		return err
	}
	defer answer.Body.Close()
	if answer.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: HTTP %d, Cluster API needs 200", target.Path, answer.StatusCode)
	}
	decoder := json.NewDecoder(answer.Body)
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(response); err != nil {
		return fmt.Errorf("POST %s: the answer does not decode into %T: %w", target.Path, response, err)
	}
	if decoder.More() {
		return fmt.Errorf("POST %s: trailing data after the answer", target.Path)
	}
	wantGVK, err := c.catalog.Response(gvh)
	if err != nil {
		return err
	}
	if got := response.GetObjectKind().GroupVersionKind(); got != wantGVK {
		return fmt.Errorf("POST %s: answer is %s, the catalog names %s", target.Path, got, wantGVK)
	}
	return nil
}
